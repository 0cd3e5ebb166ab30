# Short libFuzzer runs of the file readers as tests (included from tests/CMakeLists.txt):
# the GGUF and calibration-file readers (25 s each), the session-file reader and the server's HTTP
# request-head parser (10 s each); and five-minute runs of each under the label fuzz_long. Registered only when clang++
# exists; fuzz/run_fuzz.sh builds each target with clang itself, whatever compiler builds the
# rest. Labelled "slow" so the ASan pass of scripts/test.sh skips them (the fuzz binaries are
# already ASan + UBSan instrumented).
find_program(VQ_FUZZ_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
if(VQ_FUZZ_CLANGXX)
  foreach(_target gguf calibration session http)
    set(_secs 25)  # every CI run: the file readers 25 s, the session reader and HTTP parser 10 s
    if(_target STREQUAL "session" OR _target STREQUAL "http")
      set(_secs 10)
    endif()
    add_test(NAME fuzz_${_target}_short
             COMMAND ${PROJECT_SOURCE_DIR}/fuzz/run_fuzz.sh --target ${_target} --seconds ${_secs}
                     --out ${PROJECT_BINARY_DIR}/fuzz)
    set_tests_properties(fuzz_${_target}_short PROPERTIES
      ENVIRONMENT "VQ_FUZZ_CXX=${VQ_FUZZ_CLANGXX}" LABELS "fuzz;slow" TIMEOUT 600)
    # Minutes of fuzzing, not in every CI run (scripts/test.sh leaves out the label fuzz_long):
    # ctest -L fuzz_long
    add_test(NAME fuzz_${_target}_long
             COMMAND ${PROJECT_SOURCE_DIR}/fuzz/run_fuzz.sh --target ${_target} --seconds 300
                     --out ${PROJECT_BINARY_DIR}/fuzz)
    set_tests_properties(fuzz_${_target}_long PROPERTIES
      ENVIRONMENT "VQ_FUZZ_CXX=${VQ_FUZZ_CLANGXX}" LABELS "fuzz;slow;fuzz_long" TIMEOUT 900
      RESOURCE_LOCK vq_fuzz_out)
  endforeach()
  # All write into the same --out directory (separate binaries and corpora); one at a time.
  set_tests_properties(fuzz_gguf_short fuzz_calibration_short fuzz_session_short fuzz_http_short PROPERTIES
    RESOURCE_LOCK vq_fuzz_out)
else()
  message(STATUS "VeloxQuant: clang++ not found, the fuzz tests are not registered")
endif()
