"""Builds the Cython codec, the broker's Cython staging and the consumer's receiving helpers. Metadata lives in pyproject.toml.

Without a C compiler (or with PULSARWIRE_NO_EXTENSIONS=1) the package installs
without the extension and falls back to the pure-Python twins at import.
"""
import os

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """A failed compile leaves a working pure-Python install instead of none."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any toolchain failure
            self._warn(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._warn(exc)

    @staticmethod
    def _warn(exc):
        print(f"WARNING: pulsarwire Cython codec not built ({exc}); the pure-Python codec will be used")


def extensions():
    if os.environ.get("PULSARWIRE_NO_EXTENSIONS"):
        return []
    from Cython.Build import cythonize
    from setuptools import Extension

    flags = [] if os.name == "nt" else ["-O3"]
    return cythonize(
        [Extension("pulsarwire._codec", ["pulsarwire/_codec.pyx"], extra_compile_args=flags),
         # cimports the codec's SendFrame (pulsarwire/_codec.pxd)
         Extension("pulsarwire.broker._staging", ["pulsarwire/broker/_staging.pyx"], extra_compile_args=flags),
         Extension("pulsarwire.client._receiving", ["pulsarwire/client/_receiving.pyx"], extra_compile_args=flags)],
        compiler_directives={"language_level": "3"},
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
