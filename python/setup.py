"""`pip install ./python` from the repository: builds libsagegen_c.so with CMake (or takes an existing build) and
puts it inside the package, so `import sagegen` finds it without environment variables or path edits.

The build folder is $SAGEGEN_BUILD_DIR, else the repository's build/ (configured here if it does not exist)."""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LIBRARY = "libsagegen_c.so"


def built_library():
    build = os.environ.get("SAGEGEN_BUILD_DIR") or os.path.join(ROOT, "build")
    if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"])
    subprocess.check_call(["cmake", "--build", build, "--target", "sagegen_c", "-j", str(os.cpu_count() or 2)])
    return os.path.join(build, "runtime", LIBRARY)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "sagegen", LIBRARY)
        shutil.copyfile(built_library(), target)


setup(cmdclass={"build_py": BuildWithLibrary}, zip_safe=False)  # a shared library must be a real file
