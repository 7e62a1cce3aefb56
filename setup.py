"""The build's one step beyond pyproject.toml: the CDI minion (Rust), built into the package,
and the client's hot path beside it.

Installing cdiflow (``pip install .``, and the editable install ``make`` does through ``uv
sync``) runs ``cargo build --release --locked`` on ``cdi/minion-native/`` (setuptools-rust) and
puts the binary at ``cdi/minion/bin/cdi-minion`` inside the installed package, where
``cdi.minion.launcher`` finds it; likewise ``cdi/client-native/`` becomes the extension module
``cdi._hotpath`` (PyO3), which the client uses when it is there. Where no Rust toolchain is on
``PATH`` the install stops and says what to install; ``CDI_MINION_BIN=/path/to/cdi-minion``
ships a binary built elsewhere instead (an image that builds the minion in a stage of its own),
and then the extension is built only where Rust is (without it, the client's Python path
runs). Why setuptools-rust: docs/decisions/0001-one-minion-built-with-the-package.md.
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
CLIENT_MANIFEST = "cdi/client-native/Cargo.toml"
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
            minions = [ext for ext in self.extensions if ext.binding is Binding.Exec]
            for ext in minions:
                built = [_BuiltModule(name, prebuilt) for name in ext.target.values()]
                self.install_extension(ext, built, None)
            self.extensions = [ext for ext in self.extensions if ext not in minions]
            if not (self.extensions and _has_rust()):
                return
        elif not _has_rust():
            raise PlatformError(NO_TOOLCHAIN)
        super().run()


def _has_rust() -> bool:
    cargo = os.environ.get("CARGO", "cargo")
    return shutil.which(cargo) is not None and shutil.which("rustc") is not None


setup(
    rust_extensions=[
        RustExtension(
            {BINARY: f"cdi.minion.bin.{BINARY}"},
            path=MANIFEST,
            binding=Binding.Exec,
            cargo_manifest_args=["--locked"],  # exactly Cargo.lock's crates
            debug=False,  # the editable install too: the minion is on every hand-off
            rust_version=f">={RUST_VERSION}",
        ),
        RustExtension(
            "cdi._hotpath",
            path=CLIENT_MANIFEST,
            binding=Binding.PyO3,
            cargo_manifest_args=["--locked"],
            debug=False,  # the client's hand-off path: built optimised everywhere
            rust_version=f">={RUST_VERSION}",
        ),
    ],
    cmdclass={"build_rust": BuildMinion},
)
