"""conan create's test of the cohort package: a program built with find_package(cohort) and
linked to cohort::cohort, run at 2 ranks under the mpirun of the MPI that cohort's config found."""
import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout
from conan.tools.env import Environment
from conan.tools.files import load

RANKS = 2


class CohortTestPackageConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        # "<mpiexec>;<numproc flag>", written by CMakeLists.txt from FindMPI's results.
        mpiexec, numproc_flag = load(self, os.path.join(self.build_folder, "mpiexec.txt")).split(";")
        env = Environment()
        env.define("OMPI_MCA_rmaps_base_oversubscribe", "1")  # more ranks than cores is fine here
        if os.geteuid() == 0:  # Open MPI refuses root unless told (containers and CI run as root)
            env.define("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.define("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        program = os.path.join(self.cpp.build.bindir, "test_package")
        runs = os.path.join(self.build_folder, "runs")
        with env.vars(self).apply():
            self.run(f"{mpiexec} {numproc_flag} {RANKS} {program} {runs} {RANKS}", env="conanrun")
