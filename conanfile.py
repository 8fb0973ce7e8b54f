"""Conan 2 recipe for cohort, a header-only C++20 library.

    conan create . -s compiler.cppstd=20 --build=missing

Conan packages: nlohmann_json, range-v3, xxhash and zlib (ConanCenter's, or the wrappers of the
system's in packaging/conan/system/), and catch2 for the tests.

System requirements that no Conan package provides (install them with the system's package manager):
- MPI, C API (Open MPI or MPICH; Debian: libopenmpi-dev openmpi-bin). cohort's build and every
  consumer's find_package(cohort) find it with CMake's FindMPI; programs run under its mpirun.
- LibTorch, for the cohort::torch component only (Debian: libtorch-dev, or PyPI's torch wheel),
  found when the consumer configures: Torch_DIR, CMAKE_PREFIX_PATH, or the system's.
- CUDA runtime and NCCL, for the cohort::nccl component only.

The consumer's find_package(cohort) loads the package's own cohort-config.cmake (CMakeDeps writes
none for cohort), so the components and the MPI and LibTorch look-ups are the same as from any
other install of cohort.
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load

required_conan_version = ">=2.0"


class CohortConan(ConanFile):
    name = "cohort"
    description = ("Data-parallel training policies for LibTorch over MPI (header-only). "
                   "Needs MPI from the system; LibTorch (cohort::torch) and CUDA with NCCL "
                   "(cohort::nccl) are found on the system when those components are asked for.")
    license = "Apache-2.0"
    topics = ("mpi", "libtorch", "distributed-training", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # What the install needs; the root CMakeLists.txt adds tests/, examples/ and bench/ only when
    # their options are on.
    exports_sources = "CMakeLists.txt", "cmake/*", "include/*", "bin/*", "LICENSE"
    no_copy_source = True

    def set_version(self):
        cmake = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        match = re.search(r"project\(cohort VERSION ([0-9.]+)", cmake)
        if not match:
            raise ConanInvalidConfiguration("CMakeLists.txt: no 'project(cohort VERSION x.y.z'")
        self.version = match.group(1)

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # Ranges that ConanCenter's versions and Debian 12's (the system wrappers) both satisfy.
        self.requires("nlohmann_json/[>=3.11 <4]")
        self.requires("range-v3/[>=0.12.0 <1]")
        self.requires("xxhash/[>=0.8.1 <0.9]")
        self.requires("zlib/[>=1.2.11 <2]")

    def build_requirements(self):
        # cohort's tests build with Catch2 v2 (Debian 12's) and v3.
        self.test_requires("catch2/[>=2.13.9 <4]")

    def validate(self):
        check_min_cppstd(self, 20)
        if self.settings.os not in ("Linux", "Macos", "FreeBSD"):
            raise ConanInvalidConfiguration(f"cohort needs a POSIX system (signals, mmap), not {self.settings.os}")

    def package_id(self):
        self.info.clear()

    def generate(self):
        CMakeToolchain(self).generate()
        CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure(variables={"COHORT_BUILD_TESTS": "OFF", "COHORT_BUILD_EXAMPLES": "OFF",
                                   "COHORT_BUILD_BENCH": "OFF", "COHORT_RECORD_TORCH_DIR": "OFF"})

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        CMake(self).install()

    def package_info(self):
        # Nothing to link or load (bin/cohort-run, a script, is in the package folder).
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # The names cohort's own config defines (cohort::torch and cohort::nccl are its components).
        self.cpp_info.set_property("cmake_file_name", "cohort")
        self.cpp_info.set_property("cmake_target_name", "cohort::cohort")
        # That config, not one written by CMakeDeps: Conan cannot model MPI or LibTorch, which it
        # finds; CMakeToolchain puts builddirs on CMAKE_PREFIX_PATH.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = [os.path.join("share", "cmake", "cohort")]
