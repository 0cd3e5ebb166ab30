#pragma once
// The one exception type of the library. Messages name the file, field, shape or value at
// fault; the library never prints or exits, the CLI turns an Error into one line on stderr.
#include <stdexcept>
#include <string>

namespace vq {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace vq

// The public API lives in namespace veloxquant; the types it shares with the library's internals
// are declared in vq and named there too.
namespace veloxquant {
using vq::Error;
}  // namespace veloxquant
