# Installs the public library, its headers, a CMake package (find_package(VeloxQuant) ->
# VeloxQuant::veloxquant) and a pkg-config file (veloxquant.pc), plus the CLI. Only the shared
# library is installed: it carries its dependencies privately, so the package config needs no
# find_dependency (see src/api/CMakeLists.txt).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
if(NOT VQ_API_SHARED OR SKBUILD)
  return()
endif()

set(VQ_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/VeloxQuant)
install(TARGETS vq_api EXPORT VeloxQuantTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS veloxquant RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})  # the CLI
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/veloxquant ${PROJECT_BINARY_DIR}/include/veloxquant
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT VeloxQuantTargets NAMESPACE VeloxQuant:: DESTINATION ${VQ_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/veloxquant-config.cmake.in
                              ${PROJECT_BINARY_DIR}/veloxquant-config.cmake INSTALL_DESTINATION ${VQ_CMAKE_DIR})
# 0.x: a minor version may break the API, so only the same major.minor satisfies a request.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/veloxquant-config-version.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/veloxquant-config.cmake ${PROJECT_BINARY_DIR}/veloxquant-config-version.cmake
        DESTINATION ${VQ_CMAKE_DIR})
file(RELATIVE_PATH VQ_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)  # "../.." for lib/pkgconfig
configure_file(${PROJECT_SOURCE_DIR}/cmake/veloxquant.pc.in ${PROJECT_BINARY_DIR}/veloxquant.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/veloxquant.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The installed tree, not the build tree: install into a temporary prefix, build examples/ as a
# separate project with find_package and with pkg-config, run them, check the exported symbols.
if(VQ_BUILD_TESTS AND NOT VQ_SANITIZE)
  add_test(NAME install_consumer
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/install/check_install.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
  set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 LABELS install)
endif()
