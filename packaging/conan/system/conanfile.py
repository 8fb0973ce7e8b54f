"""A Conan package for a library the system's package manager installs (Debian and Ubuntu: apt).

    conan export packaging/conan/system --name zlib                 # version: the installed one
    conan export packaging/conan/system --name zlib --version 1.2.13

One recipe for each library in LIBRARIES, which gives its apt package and the CMake names
ConanCenter's recipe gives it, so that a recipe written against ConanCenter (cohort's conanfile.py)
builds unchanged on the system's copies. The version defaults to the installed package's upstream
version (Debian's 1:1.2.13.dfsg-1 gives 1.2.13).

The package holds no files. system_requirements() checks that the apt package is installed (Conan's
default tools.system.package_manager:mode=check; mode=install installs it), and package_info()
points at the system's headers and libraries, which are on the compiler's default search paths,
so it adds no include or library folder.
"""
import re
import subprocess

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.system import package_manager

required_conan_version = ">=2.0"

# name: apt package, package type, system libraries to link, CMake names (as ConanCenter's recipe).
LIBRARIES = {
    "nlohmann_json": {"apt": "nlohmann-json3-dev", "type": "header-library", "libs": [],
                      "cmake_file_name": "nlohmann_json", "cmake_target_name": "nlohmann_json::nlohmann_json"},
    "range-v3": {"apt": "librange-v3-dev", "type": "header-library", "libs": [],
                 "cmake_file_name": "range-v3", "cmake_target_name": "range-v3::range-v3"},
    "xxhash": {"apt": "libxxhash-dev", "type": "shared-library", "libs": ["xxhash"],
               "cmake_file_name": "xxHash", "cmake_target_name": "xxHash::xxhash"},
    "zlib": {"apt": "zlib1g-dev", "type": "shared-library", "libs": ["z"],
             "cmake_file_name": "ZLIB", "cmake_target_name": "ZLIB::ZLIB", "cmake_find_mode": "both"},
    "catch2": {"apt": "catch2", "type": "header-library", "libs": [],
               "cmake_file_name": "Catch2", "cmake_target_name": "Catch2::Catch2"},
}


def _library(name):
    if name not in LIBRARIES:
        raise ConanException(f"packaging/conan/system: no system library '{name}'; "
                             f"one of: {', '.join(sorted(LIBRARIES))}")
    return LIBRARIES[name]


def upstream_version(debian_version):
    """The upstream part of a Debian version: '1:1.2.13.dfsg-1' -> '1.2.13'."""
    match = re.match(r"^(?:\d+:)?(\d+(?:\.\d+)*)", debian_version)
    return match.group(1) if match else None


class SystemLibraryConan(ConanFile):
    description = "A library installed by the system's package manager (no files of its own)"
    settings = "os", "arch", "compiler", "build_type"
    package_type = "unknown"  # set per library in init()

    def init(self):
        if self.name:
            self.package_type = _library(self.name)["type"]

    def set_version(self):
        if self.version:
            return
        apt = _library(self.name)["apt"]
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", apt],
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            raise ConanException(f"{self.name}: apt package {apt} is not installed; install it "
                                 f"(apt-get install {apt}) or give --version")
        version = upstream_version(out.strip())
        if not version:
            raise ConanException(f"{self.name}: cannot read a version from '{out.strip()}' ({apt})")
        self.version = version

    def validate(self):
        if self.settings.os != "Linux":
            raise ConanInvalidConfiguration(f"{self.name}: this wrapper is for Linux's packages")

    def package_id(self):
        self.info.clear()

    def system_requirements(self):
        package_manager.Apt(self).install([_library(self.name)["apt"]], update=True, check=True)

    def package_info(self):
        lib = _library(self.name)
        self.cpp_info.includedirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.bindirs = []
        self.cpp_info.system_libs = list(lib["libs"])
        for prop in ("cmake_file_name", "cmake_target_name", "cmake_find_mode"):
            if prop in lib:
                self.cpp_info.set_property(prop, lib[prop])
