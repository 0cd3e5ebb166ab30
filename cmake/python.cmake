# The Python module veloxquant._veloxquant (nanobind) over the public API. Built by pip through
# scikit-build-core (SKBUILD), and in an ordinary build tree when .venv has nanobind (scripts/setup.sh),
# where the tests import it from <build>/python. Never with sanitizers: Python itself is not
# instrumented.
set(_vq_py_default OFF)
if(NOT SKBUILD AND NOT VQ_SANITIZE AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  execute_process(COMMAND ${PROJECT_SOURCE_DIR}/.venv/bin/python -m nanobind --cmake_dir
                  OUTPUT_VARIABLE _vq_nb_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _vq_nb_rc)
  if(_vq_nb_rc EQUAL 0)
    set(_vq_py_default ON)
    set(Python_EXECUTABLE ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  endif()
endif()
option(VQ_BUILD_PYTHON "Build the Python module (needs nanobind)" ${_vq_py_default})
if(NOT (SKBUILD OR VQ_BUILD_PYTHON))
  return()
endif()
add_subdirectory(${PROJECT_SOURCE_DIR}/python ${PROJECT_BINARY_DIR}/python)
