#pragma once
// Makes text from files and models safe to print on a terminal: control characters (C0, DEL,
// the C1 range U+0080..U+009F) and bytes that are not valid UTF-8 become visible escapes
// (\x1b, \u009b), so a crafted file name, metadata string or token cannot move the cursor,
// retitle the window or write the clipboard through escape sequences, and a message stays on
// one line.
#include <string>
#include <string_view>

namespace vq {

// keep_layout: leave '\n' and '\t' as they are (running text); otherwise they are escaped too.
std::string escape_control(std::string_view s, bool keep_layout = false);

// escape_control(keep_layout) over text that arrives in pieces (generated tokens), which may
// split a UTF-8 character: an incomplete sequence at the end of a piece is held back until the
// next piece completes it, rather than escaped as invalid.
class StreamEscaper {
 public:
  std::string push(std::string_view piece);  // what can be printed now
  std::string flush();                       // the rest, at the end of the text
 private:
  std::string pending_;
};

}  // namespace vq
