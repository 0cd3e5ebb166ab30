# Short libFuzzer run of the GGUF reader as a test (included from tests/CMakeLists.txt).
# Registered only when clang++ exists; fuzz/run_fuzz.sh builds the target with clang itself,
# whatever compiler builds the rest. Labelled "slow" so the ASan pass of scripts/test.sh skips
# it (the fuzz binary is already ASan + UBSan instrumented).
find_program(VQ_FUZZ_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
if(VQ_FUZZ_CLANGXX)
  add_test(NAME fuzz_gguf_short
           COMMAND ${PROJECT_SOURCE_DIR}/fuzz/run_fuzz.sh --seconds 25 --out ${PROJECT_BINARY_DIR}/fuzz)
  set_tests_properties(fuzz_gguf_short PROPERTIES
    ENVIRONMENT "VQ_FUZZ_CXX=${VQ_FUZZ_CLANGXX}" LABELS "fuzz;slow" TIMEOUT 600)
else()
  message(STATUS "VeloxQuant: clang++ not found, the GGUF fuzz test is not registered")
endif()
