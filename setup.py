"""The build's one step beyond pyproject.toml: the CDI minion (Rust), built into the package.

Installing cdiflow (``pip install .``, and the editable install ``make`` does through ``uv
sync``) runs ``cargo build --release --locked`` on ``cdi/minion-native/`` (setuptools-rust) and
puts the binary at ``cdi/minion/bin/cdi-minion`` inside the installed package, where
``cdi.minion.launcher`` finds it. Where no Rust toolchain is on ``PATH`` the install stops and
says what to install; ``CDI_MINION_BIN=/path/to/cdi-minion`` ships a binary built elsewhere
instead (an image that builds the minion in a stage of its own). Why setuptools-rust:
docs/decisions/0001-one-minion-built-with-the-package.md.
"""

from __future__ import annotations

import os
import shutil

from setuptools import setup
from setuptools.errors import PlatformError
from setuptools_rust import Binding, RustExtension, build_rust
from setuptools_rust.build import _BuiltModule  # pinned: [tool.uv] build-constraint-dependencies

BINARY = "cdi-minion"
MANIFEST = "cdi/minion-native/Cargo.toml"
RUST_VERSION = "1.85"  # Cargo.toml's rust-version
PREBUILT = "CDI_MINION_BIN"

NO_TOOLCHAIN = f"""
cdiflow builds its CDI minion (cdi/minion-native/, Rust) when it is installed, and found no
Rust toolchain (cargo and rustc) on PATH.

Install Rust {RUST_VERSION} or newer, then install cdiflow again:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
    . "$HOME/.cargo/env"
(or your system's package, if it is recent enough: `apt-get install cargo` on Debian 13).

Or ship a minion built elsewhere: {PREBUILT}=/path/to/{BINARY} pip install ...
"""


class BuildMinion(build_rust):
    """``build_rust``, with a clear word where Rust is missing and a prebuilt binary option."""

    def run(self) -> None:
        prebuilt = os.environ.get(PREBUILT)
        if prebuilt:
            if not (os.path.isfile(prebuilt) and os.access(prebuilt, os.X_OK)):
                raise PlatformError(f"{PREBUILT}={prebuilt!r} is not an executable file")
            for ext in self.extensions:
                built = [_BuiltModule(name, prebuilt) for name in ext.target.values()]
                self.install_extension(ext, built, None)
            return
        cargo = os.environ.get("CARGO", "cargo")
        if shutil.which(cargo) is None or shutil.which("rustc") is None:
            raise PlatformError(NO_TOOLCHAIN)
        super().run()


setup(
    rust_extensions=[
        RustExtension(
            {BINARY: f"cdi.minion.bin.{BINARY}"},
            path=MANIFEST,
            binding=Binding.Exec,
            cargo_manifest_args=["--locked"],  # exactly Cargo.lock's crates
            debug=False,  # the editable install too: the minion is on every hand-off
            rust_version=f">={RUST_VERSION}",
        )
    ],
    cmdclass={"build_rust": BuildMinion},
)
