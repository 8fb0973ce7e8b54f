# An overlay port that builds the checkout it lives in:
#   vcpkg install cohort --overlay-ports=<checkout>/ports
# Header-only: one configuration, nothing in lib/. MPI and LibTorch are the system's (see usage).
set(VCPKG_BUILD_TYPE release)
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DCOHORT_BUILD_TESTS=OFF
        -DCOHORT_BUILD_EXAMPLES=OFF
        -DCOHORT_BUILD_BENCH=OFF
        -DCOHORT_INSTALL_CMAKEDIR=share/cohort
        -DCOHORT_RECORD_TORCH_DIR=OFF
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME cohort CONFIG_PATH share/cohort)

# cohort-run is a shell script: a tool, where vcpkg keeps a port's tools.
file(INSTALL "${CURRENT_PACKAGES_DIR}/bin/cohort-run" DESTINATION "${CURRENT_PACKAGES_DIR}/tools/${PORT}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/bin" "${CURRENT_PACKAGES_DIR}/lib" "${CURRENT_PACKAGES_DIR}/debug")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
