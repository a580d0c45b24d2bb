# Conan 2 recipe for zshard: a header-only C++20 library (one package for every setting),
# found by consumers as find_package(zshard) and linked as zshard::zshard.
#   conan create conan/                  (from the repository root; conan/create_offline.sh runs it
#                                         offline, with Eigen and doctest from the system)
import os

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy
from conan.tools.layout import basic_layout


class ZshardConan(ConanFile):
    name = "zshard"
    version = "0.1.0"
    description = "ZeRO-3 sharding of parameters, gradients and optimizer state for C++/CUDA training stacks"
    topics = ("deep-learning", "zero", "sharding", "distributed-training", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    no_copy_source = True

    def export_sources(self):
        # The recipe lives in conan/; the library is the repository's include/ tree.
        root = os.path.join(self.recipe_folder, "..")
        copy(self, "include/*", src=root, dst=self.export_sources_folder)

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        # Eigen for the examples' math and users' models; doctest for zshard/testing's checks.
        self.requires("eigen/[>=3.4 <4]")
        self.requires("doctest/[>=2.4 <3]")

    def package_id(self):
        self.info.clear()  # headers only: one package whatever the settings

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package(self):
        copy(self, "*", src=os.path.join(self.source_folder, "include"), dst=os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "zshard")
        self.cpp_info.set_property("cmake_target_name", "zshard::zshard")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
