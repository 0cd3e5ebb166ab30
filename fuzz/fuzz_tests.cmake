# Short libFuzzer runs of the two file readers as tests (included from tests/CMakeLists.txt):
# the GGUF reader and the calibration-file reader, 25 s each. Registered only when clang++
# exists; fuzz/run_fuzz.sh builds each target with clang itself, whatever compiler builds the
# rest. Labelled "slow" so the ASan pass of scripts/test.sh skips them (the fuzz binaries are
# already ASan + UBSan instrumented).
find_program(VQ_FUZZ_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
if(VQ_FUZZ_CLANGXX)
  foreach(_target gguf calibration)
    add_test(NAME fuzz_${_target}_short
             COMMAND ${PROJECT_SOURCE_DIR}/fuzz/run_fuzz.sh --target ${_target} --seconds 25
                     --out ${PROJECT_BINARY_DIR}/fuzz)
    set_tests_properties(fuzz_${_target}_short PROPERTIES
      ENVIRONMENT "VQ_FUZZ_CXX=${VQ_FUZZ_CLANGXX}" LABELS "fuzz;slow" TIMEOUT 600)
  endforeach()
  # Both write into the same --out directory (separate binaries and corpora); one at a time.
  set_tests_properties(fuzz_gguf_short fuzz_calibration_short PROPERTIES RESOURCE_LOCK vq_fuzz_out)
  # The server's HTTP request-head parser (fuzz/fuzz_http.cpp), 120 s: labelled fuzz/slow too.
  add_test(NAME fuzz_http_short
           COMMAND ${PROJECT_SOURCE_DIR}/fuzz/run_fuzz.sh --target http --seconds 120 --out ${PROJECT_BINARY_DIR}/fuzz)
  set_tests_properties(fuzz_http_short PROPERTIES
    ENVIRONMENT "VQ_FUZZ_CXX=${VQ_FUZZ_CLANGXX}" LABELS "fuzz;slow" TIMEOUT 600 RESOURCE_LOCK vq_fuzz_out)
else()
  message(STATUS "VeloxQuant: clang++ not found, the fuzz tests are not registered")
endif()
