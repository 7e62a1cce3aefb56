"""``make image``: cdiflow's images, built on this machine with podman and no registry.

* **the base** (``localhost/cdiflow-base:bookworm-<recipe>``): Debian 12 made with
  ``debootstrap --variant=minbase`` from the apt mirror this machine uses, imported with
  ``podman import``; made once per recipe and kept;
* **the product** (``localhost/cdiflow:<version>``, ``deploy/image/Containerfile``): Debian's
  Python, the dependencies exactly as ``uv.lock`` pins them (``uv export`` with every hash,
  installed with ``--require-hashes``), cdiflow's wheel (built from the working tree: every
  package ``pyproject.toml`` ships, so the image holds whatever the roles import) and the native
  minion built here with cargo; every role runs from it;
* **the services** (``localhost/cdiflow-postgres``, ``-redis``, ``-s3``): Debian's PostgreSQL 15
  and Redis, and the ``versitygw`` binary ``make s3server`` built with Go, one image each.

podman's layer cache makes a second build of an unchanged tree quick: the context is staged in
``build/image`` with stable bytes (the wheel is rebuilt only when a source file changed, and
reproducibly), so every step hits the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from deploy.containers.errors import ContainerError, PodmanMissing
from deploy.containers.podman import CHECKOUT, exists, podman, podman_env, require_podman

__all__ = [
    "BASE_RECIPE",
    "IMAGE_LABEL",
    "SOURCE_LABEL",
    "Images",
    "build_images",
    "build_wheel",
    "debian_mirror",
    "images",
    "source_digest",
    "wheel_sources",
]

IMAGE_LABEL: Final = "io.cdiflow.image"
INPUTS_LABEL: Final = "io.cdiflow.inputs"
SOURCE_LABEL: Final = "io.cdiflow.source"
SUITE: Final = "bookworm"
# Changing any of this makes a new base (its tag is a digest of it).
BASE_RECIPE: Final = (SUITE, "minbase", "prune-docs-1")
DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"
DEFAULT_SECURITY: Final = "http://deb.debian.org/debian-security"
_IMAGE_DIR: Final = CHECKOUT / "deploy" / "image"
_STAGE: Final = CHECKOUT / "build" / "image"
_MINION: Final = CHECKOUT / "cdi" / "minion" / "bin" / "cdi-minion"  # the install builds it
_REPRODUCIBLE_EPOCH: Final = "315532800"  # 1980-01-01: the oldest date a zip entry can hold
_Say = Callable[[str], None]
_DIGESTS_LOCK: Final = threading.Lock()  # the digests' cache file, shared by the builds


@dataclass(frozen=True)
class Images:
    """The images' references: the product, and one per service."""

    version: str
    product: str
    postgres: str
    redis: str
    s3: str

    def all(self) -> dict[str, str]:
        return {"product": self.product, "postgres": self.postgres, "redis": self.redis,
                "s3": self.s3}  # fmt: skip


def images(version: str | None = None) -> Images:
    """The references ``make image`` tags (``version``: the project's, from pyproject.toml)."""
    if version is None:
        with (CHECKOUT / "pyproject.toml").open("rb") as f:
            version = str(tomllib.load(f)["project"]["version"])
    return Images(
        version=version,
        product=f"localhost/cdiflow:{version}",
        postgres=f"localhost/cdiflow-postgres:{version}",
        redis=f"localhost/cdiflow-redis:{version}",
        s3=f"localhost/cdiflow-s3:{version}",
    )


def build_images(*, refresh_base: bool = False, say: _Say | None = None) -> Images:
    """Build (or find cached) the base, the product and the service images; their names."""
    require_podman()
    tell = say or _stderr
    began = time.monotonic()
    names = images()
    base = _base(refresh=refresh_base, say=tell)
    _stage(tell)
    python_image = f"localhost/cdiflow-python:{names.version}"

    def product() -> int:
        built = _build(python_image, "python.Containerfile", tell, BASE=base)
        site_packages = _dependencies(python_image, tell)
        source = {SOURCE_LABEL: source_digest()}
        return built + _build(names.product, "Containerfile", tell, labels=source,
                              PYTHON_IMAGE=python_image, SITE_PACKAGES=site_packages)  # fmt: skip

    def services() -> int:
        files = {names.postgres: "postgres.Containerfile", names.redis: "redis.Containerfile",
                 names.s3: "s3.Containerfile"}  # fmt: skip
        return sum(_build(ref, file, tell, BASE=base) for ref, file in files.items())

    # The two chains side by side: a first build waits on the mirror and on dpkg as much as
    # on the CPU.
    with ThreadPoolExecutor(2) as pool:
        built = sum(f.result() for f in [pool.submit(product), pool.submit(services)])
    if built:
        # What earlier builds left untagged (ours only, by label): without this, every change
        # of the tree would keep another copy of the last layers.
        podman("image", "prune", "--force", "--filter", f"label={IMAGE_LABEL}", check=False)
    tell(f"images ready in {time.monotonic() - began:.1f} s")
    return names


def _build(
    ref: str, containerfile: str, say: _Say, labels: dict[str, str] | None = None, **build_args: str
) -> int:
    """``podman build`` of ``ref``, unless the image there was built from the same inputs
    (its ``io.cdiflow.inputs`` label: a digest of the context and the arguments). 1 if built.
    *Why not leave it to podman's cache:* it hashes every file it adds on every build, a few
    seconds for the dependencies alone."""
    inputs = _inputs_digest(containerfile, build_args | (labels or {}))
    if exists("image", ref):
        current = podman("image", "inspect", "--format", "{{json .Labels}}", ref).strip()
        if json.loads(current or "{}").get(INPUTS_LABEL) == inputs:
            say(f"image {ref}: up to date")
            return 0
    began = time.monotonic()
    args = [a for name, value in build_args.items() for a in ("--build-arg", f"{name}={value}")]
    args += [a for name, value in (labels or {}).items() for a in ("--label", f"{name}={value}")]
    podman(
        "build", "--layers", "--pull=never", *args, "--label", f"{IMAGE_LABEL}={ref}",
        "--label", f"{INPUTS_LABEL}={inputs}", "-f", str(_STAGE / containerfile), "-t", ref,
        str(_STAGE), timeout=1800,
    )  # fmt: skip
    say(f"image {ref}: built in {time.monotonic() - began:.1f} s")
    return 1


def _inputs_digest(containerfile: str, build_args: dict[str, str]) -> str:
    """What a build reads: the staged context (each file's digest, remembered by size and
    mtime so that large unchanged files are not read again), the arguments, and the images
    they name (by id: a base made again changes it)."""
    with _DIGESTS_LOCK:
        return _locked_inputs_digest(containerfile, build_args)


def _locked_inputs_digest(containerfile: str, build_args: dict[str, str]) -> str:
    cache_file = _STAGE.parent / "image-digests.json"
    try:
        cache: dict[str, list[Any]] = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    digest = hashlib.sha256(containerfile.encode())
    for path in _context_files(containerfile):
        info = path.stat()
        rel = str(path.relative_to(_STAGE))
        known = cache.get(rel)
        if known is None or known[:2] != [info.st_size, info.st_mtime_ns]:
            known = [info.st_size, info.st_mtime_ns, _file_digest(path)]
            cache[rel] = known
        digest.update(f"{rel}\0{known[2]}\0".encode())
    for name, value in sorted(build_args.items()):
        digest.update(f"{name}={value}\0".encode())
        if value.startswith("localhost/"):
            digest.update(podman("image", "inspect", "--format", "{{.Id}}", value).encode())
    cache_file.write_text(json.dumps(cache))
    return digest.hexdigest()


def _context_files(containerfile: str) -> list[Path]:
    """The Containerfile and every file of the context it reads: the sources of its COPY and
    ADD lines and of its bind mounts."""
    text = (_STAGE / containerfile).read_text()
    names = {containerfile}
    for line in re.sub(r"\\\n", " ", text).splitlines():
        words = line.split()
        if words and words[0] in ("COPY", "ADD"):
            names.update(w for w in words[1:-1] if not w.startswith("--"))
        names.update(re.findall(r"--mount=type=bind,source=([^,\s]+)", line))
    found: list[Path] = []
    for name in sorted(names):
        path = _STAGE / name
        found += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return found


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _dependencies(python_image: str, say: _Say) -> str:
    """The lock's packages installed here (``uv pip install --target``, every hash checked)
    for the image's own Python and glibc, into ``build/image/site-packages``, which the
    product image copies into its venv; that venv's site-packages folder."""
    probe = podman(
        "run", "--rm", "--network", "none", python_image, "python3", "-c",
        "import os, platform, sys; print(platform.python_version(), "
        "os.confstr('CS_GNU_LIBC_VERSION').split()[1], platform.machine(), "
        "'%d.%d' % sys.version_info[:2])",
    ).split()  # fmt: skip
    version, glibc, machine, minor = probe
    platform_tag = f"{machine}-manylinux_{glibc.replace('.', '_')}"
    requirements = _STAGE / "requirements.txt"
    target = _STAGE / "site-packages"
    key = hashlib.sha256(f"{requirements.read_text()}{version}{platform_tag}".encode())
    stamp = _STAGE / "site-packages.sha256"
    archive = _STAGE / "site-packages.tar"
    if not (stamp.is_file() and stamp.read_text() == key.hexdigest() and archive.is_file()):
        shutil.rmtree(target, ignore_errors=True)
        _run(
            [str(Path(sys.executable).parent / "uv"), "pip", "install", "--quiet",
             "--target", str(target), "--python-version", version,
             "--python-platform", platform_tag, "--require-hashes", "--no-deps",
             "--compile-bytecode", "--link-mode", "copy", "-r", str(requirements)],
            "uv pip install (the lock's packages for the image)",
        )  # fmt: skip
        # Copies, not hard links into uv's cache: another install linking the same file
        # changes its inode while tar reads it ("file changed as we read it").
        # One archive for the build to add: podman hashes one file far faster than the
        # thousands of a site-packages folder, on every build.
        _run(["tar", "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "-C",
              str(target), "-cf", str(_STAGE / "site-packages.tar"), "."], "tar")  # fmt: skip
        shutil.rmtree(target)
        stamp.write_text(key.hexdigest())
        say(f"the lock's packages installed for Python {version} on {platform_tag}")
    return f"/opt/cdiflow/lib/python{minor}/site-packages"


# -- the base --------------------------------------------------------------------------------


def debian_mirror(sources: Iterable[Path] | None = None) -> tuple[str, str]:
    """The Debian archive and security archive this machine's apt uses (``$DEBIAN_MIRROR``
    overrides the first), read from ``/etc/apt/sources.list`` and ``sources.list.d``."""
    files = list(sources) if sources is not None else _apt_sources()
    archive, security = "", ""
    for uri, suites in _entries(files):
        if f"{SUITE}-security" in suites and not security:
            security = uri
        elif SUITE in suites and not archive:
            archive = uri
    return os.environ.get("DEBIAN_MIRROR") or archive or DEFAULT_MIRROR, security or (
        DEFAULT_SECURITY
    )


def _apt_sources() -> list[Path]:
    etc = Path("/etc/apt")
    found = [etc / "sources.list"] if (etc / "sources.list").is_file() else []
    found += sorted((etc / "sources.list.d").glob("*.sources"))
    found += sorted((etc / "sources.list.d").glob("*.list"))
    return found


def _entries(files: Iterable[Path]) -> Iterable[tuple[str, list[str]]]:
    """(URI, suites) of every ``deb`` entry, one-line or deb822."""
    for path in files:
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = _deb822(stanza)
                if "deb" in fields.get("types", "").split():
                    for uri in fields.get("uris", "").split():
                        yield uri.rstrip("/"), fields.get("suites", "").split()
            continue
        for line in text.splitlines():
            words = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                yield words[1].rstrip("/"), [words[2]]


def _deb822(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields


def _base(*, refresh: bool, say: _Say) -> str:
    archive, security = debian_mirror()
    recipe = "\n".join((*BASE_RECIPE, archive, security))
    tag = f"localhost/cdiflow-base:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if exists("image", tag) and not refresh:
        say(f"image {tag}: cached")
        return tag
    if shutil.which("debootstrap") is None:
        raise PodmanMissing(
            "debootstrap is not installed: `make image` installs it as root (apt-get install "
            "debootstrap)"
        )
    began = time.monotonic()
    say(f"image {tag}: debootstrap {SUITE} from {archive} (a minute or two, once)")
    with tempfile.TemporaryDirectory(prefix="cdiflow-base-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", SUITE, str(root), archive],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ContainerError(f"debootstrap failed: {(done.stderr or done.stdout)[-2000:]}")
        _lean(root, archive, security)
        _import(root, tag)
    say(f"image {tag}: made in {time.monotonic() - began:.1f} s")
    return tag


def _lean(root: Path, archive: str, security: str) -> None:
    """apt's downloads and lists, documentation and translations out; the mirror's updates
    and security archives in; later installs without documentation or recommendations."""
    for folder in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                   "usr/share/man", "usr/share/info", "usr/share/locale"):  # fmt: skip
        for entry in (root / folder).glob("*"):
            if entry.is_file() or entry.is_symlink():
                entry.unlink()
            elif entry.name != "partial":
                shutil.rmtree(entry)
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(
        f"Types: deb\nURIs: {archive}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        f"Types: deb\nURIs: {security}\nSuites: {SUITE}-security\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    (root / "etc/apt/apt.conf.d/90cdiflow").write_text(
        'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
        'Acquire::Languages "none";\n'
    )
    (root / "etc/dpkg/dpkg.cfg.d/90cdiflow").write_text(
        "path-exclude=/usr/share/doc/*\npath-exclude=/usr/share/man/*\n"
        "path-exclude=/usr/share/info/*\npath-exclude=/usr/share/locale/*\n"
    )


def _import(root: Path, tag: str) -> None:
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-c", "."],
        stdout=subprocess.PIPE,
    )
    assert tar.stdout is not None
    imported = subprocess.run(
        ["podman", "import", "--change", f"LABEL {IMAGE_LABEL}=base", "-", tag],
        stdin=tar.stdout, capture_output=True, text=True, env=podman_env(), check=False,
    )  # fmt: skip
    tar.stdout.close()
    if tar.wait() != 0 or imported.returncode != 0:
        raise ContainerError(f"podman import of the base failed: {imported.stderr[-2000:]}")


# -- the build context -----------------------------------------------------------------------


def _stage(say: _Say) -> None:
    """``build/image``: the Containerfiles, the lock's requirements, uv, the minion,
    versitygw and cdiflow's wheel, each rewritten only when it changed."""
    _STAGE.mkdir(parents=True, exist_ok=True)
    for source in _IMAGE_DIR.iterdir():
        _sync(source, _STAGE / source.name)
    bin_dir = Path(sys.executable).parent
    uv = bin_dir / "uv"
    needs = {
        "uv": (uv, "`make .venv/.installed` installs the lock's uv"),
        "cdi-minion": (_MINION, "`make native` builds the minion (needs cargo)"),
        "versitygw": (bin_dir / "versitygw", "build it with `make s3server` (needs Go)"),
    }
    for name, (source, hint) in needs.items():
        if not source.is_file():
            raise ContainerError(f"{source} is missing: {hint}")
        _sync(source, _STAGE / name)
    exported = _run(
        [str(uv), "export", "--frozen", "--no-dev", "--extra", "ar", "--no-emit-project",
         "--no-header", "--format", "requirements-txt"],
        "uv export",
    )  # fmt: skip
    _write_if_changed(_STAGE / "requirements.txt", exported)
    _wheel(uv, say)


def _wheel(uv: Path, say: _Say) -> None:
    """cdiflow's wheel in the build context, built again only when a file it is made of
    changed (``source_digest``)."""
    digest = source_digest()
    stamp = _STAGE / "wheel.sha256"
    wheel_dir = _STAGE / "wheel"
    if stamp.is_file() and stamp.read_text() == digest and any(wheel_dir.glob("*.whl")):
        return
    shutil.rmtree(wheel_dir, ignore_errors=True)
    build_wheel(wheel_dir, uv)
    stamp.write_text(digest)
    say("cdiflow's wheel built from the working tree")


def build_wheel(out_dir: Path, uv: Path | None = None) -> Path:
    """cdiflow's wheel, built from a copy of the files it is made of (``wheel_sources``, as
    they are in the working tree), reproducibly (``SOURCE_DATE_EPOCH``): the same files make
    the same bytes. *Why a copy:* setuptools keeps a ``build/`` folder in the tree it builds,
    from which a module deleted since would still be packaged."""
    uv = uv or Path(sys.executable).parent / "uv"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cdiflow-wheel-") as tmp:
        tree = Path(tmp) / "src"
        for rel in wheel_sources():
            target = tree / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(CHECKOUT / rel, target)
        out = Path(tmp) / "dist"
        env = {**os.environ, "SOURCE_DATE_EPOCH": _REPRODUCIBLE_EPOCH}
        _run([str(uv), "build", "--wheel", "--quiet", "--out-dir", str(out), str(tree)],
             "uv build", env=env)  # fmt: skip
        [wheel] = list(out.glob("*.whl"))
        shutil.copy2(wheel, out_dir / wheel.name)
    return out_dir / wheel.name


def wheel_sources() -> list[str]:
    """The working tree's files (tracked, and new ones not ignored) that the wheel is made
    of: pyproject.toml, README.md and the top-level packages pyproject.toml ships."""
    with (CHECKOUT / "pyproject.toml").open("rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {p.split("*")[0].split(".")[0] for p in patterns}
    listed = _run(["git", "-C", str(CHECKOUT), "ls-files", "-z", "--cached", "--others",
                   "--exclude-standard"], "git ls-files")  # fmt: skip
    return sorted(
        rel for rel in listed.split("\0")
        if rel and (CHECKOUT / rel).is_file()
        and (rel in ("pyproject.toml", "README.md") or rel.split("/")[0] in tops)
    )  # fmt: skip


def source_digest() -> str:
    """A digest of the files the wheel is made of: the product image carries it (label
    ``io.cdiflow.source``), so a test can tell an image built from another tree."""
    digest = hashlib.sha256()
    for rel in wheel_sources():
        digest.update(rel.encode() + b"\0" + (CHECKOUT / rel).read_bytes() + b"\0")
    return digest.hexdigest()


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise ContainerError(f"{what} failed: {(done.stderr or done.stdout)[-2000:]}")
    return done.stdout


def _sync(source: Path, target: Path) -> None:
    """Copy ``source`` over ``target`` unless it already holds the same bytes."""
    if target.is_file():
        same_stat = target.stat().st_size == source.stat().st_size
        if same_stat and target.read_bytes() == source.read_bytes():
            return
    tmp = target.with_name(target.name + ".tmp")
    shutil.copy2(source, tmp)
    tmp.replace(target)


def _write_if_changed(target: Path, text: str) -> None:
    if not target.is_file() or target.read_text() != text:
        target.write_text(text)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
