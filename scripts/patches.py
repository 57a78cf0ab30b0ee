#!/usr/bin/env python3
"""Keep `vendor/llama.cpp` and `patches/` in step.

The vendored tree is never committed to this repository: it is rebuilt from the
pinned `llama-cpp-python` sdist (checked by sha256) plus the ordered patch files
in `patches/`. Inside `vendor/llama.cpp` a git repository records pristine
upstream as its first commit (tag `upstream`) and one commit per patch on top,
so our work is always a clean `git diff upstream`.

The patches are a curated queue: one patch per concern (the C API, the ggml ops,
the CPU kernels, ...), each named by the word before the colon of its subject
(`ggml-cpu: CPU kernels of ...` is concern `ggml-cpu`). A change to a concern
amends that concern's commit; it never appends a patch that edits an earlier one:

  edit in vendor/llama.cpp, then
  python3 scripts/patches.py export --into ggml-cpu
  (or commit yourself with `git commit --fixup=<commit>` in vendor/llama.cpp and
   run `export`: fixup commits are squashed into their targets by autosquash)

export then regenerates every patch file. A new concern is added with
`export --new "name: subject"`.

Commands:
  apply     pristine + patches -> vendor tree (fetches and unpacks upstream first if needed)
  export    vendor tree edits -> patches/ (fixups autosquashed into their concerns)
  check     exit 1 when the vendor tree holds edits that patches/ lacks, or patches do not apply
  concerns  list the concerns (one per patch) and their commits
  status    short summary

Only the standard library is used: this runs inside CMake's configure step and in
pip's isolated build environment.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor" / "llama.cpp"
PATCHES = ROOT / "patches"
UPSTREAM_FILE = PATCHES / "UPSTREAM"  # "key = value" lines: package, version, sha256, subdir
TAG = "upstream"
# Fixed identity and dates keep commits (and therefore exported patches) reproducible.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "kairox",
    "GIT_AUTHOR_EMAIL": "kairox@localhost",
    "GIT_COMMITTER_NAME": "kairox",
    "GIT_COMMITTER_EMAIL": "kairox@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}


class PatchError(RuntimeError):
    pass


def upstream_pin() -> dict[str, str]:
    pin = {}
    for line in UPSTREAM_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            k, v = (s.strip() for s in line.split("=", 1))
            pin[k] = v
    for key in ("package", "version", "sha256", "subdir"):
        if key not in pin:
            raise PatchError(f"{UPSTREAM_FILE}: missing '{key}'")
    return pin


def git(*args: str, cwd: Path = VENDOR, check: bool = True, capture: bool = True,
        env: dict[str, str] | None = None, input: bytes | None = None) -> str:
    full_env = dict(os.environ, **GIT_ENV)
    full_env.pop("GIT_DIR", None)
    full_env.pop("GIT_WORK_TREE", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(["git", "-c", "core.autocrlf=false", "-c", "gc.auto=0", *args],
                          cwd=cwd, env=full_env, input=input,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)
    if check and proc.returncode != 0:
        err = (proc.stderr or b"").decode(errors="replace").strip()
        raise PatchError(f"git {' '.join(args)} failed in {cwd}: {err}")
    return (proc.stdout or b"").decode(errors="replace")


def cache_dir() -> Path:
    base = os.environ.get("KAIROX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kairox")
    p = Path(base) / "downloads"
    p.mkdir(parents=True, exist_ok=True)
    return p


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(pkg: str, version: str, dest: Path) -> None:
    """Fetch the sdist with pip (honours the user's index configuration).

    `--no-binary <pkg>` (not `:all:`) with `--no-build-isolation`: pip only has to read
    the sdist's metadata, and must not build cmake or ninja from source to do so.
    """
    candidates = [[sys.executable, "-m", "pip"]]
    if shutil.which("pip"):
        candidates.append([shutil.which("pip")])
    last = ""
    for pip in candidates:
        cmd = pip + ["download", "--no-deps", "--no-binary", pkg, "--no-build-isolation",
                     f"{pkg}=={version}", "-d", str(dest)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode == 0:
            return
        last = proc.stdout.decode(errors="replace")[-2000:]
    raise PatchError(f"pip download of {pkg}=={version} failed:\n{last}")


def _pypi_download(pkg: str, version: str, dest: Path) -> None:
    """Fallback when pip cannot run (e.g. inside a minimal build environment)."""
    url = f"https://pypi.org/pypi/{pkg}/{version}/json"
    with urllib.request.urlopen(url, timeout=60) as r:
        meta = json.load(r)
    for f in meta["urls"]:
        if f["packagetype"] == "sdist":
            target = dest / f["filename"]
            with urllib.request.urlopen(f["url"], timeout=600) as r, open(target, "wb") as out:
                shutil.copyfileobj(r, out)
            return
    raise PatchError(f"no sdist for {pkg}=={version} on PyPI")


def fetch_sdist(pin: dict[str, str]) -> Path:
    pkg, version, want = pin["package"], pin["version"], pin["sha256"]
    name = f"{pkg.replace('-', '_')}-{version}.tar.gz"
    cached = cache_dir() / name
    if cached.exists() and sha256_of(cached) == want:
        return cached
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        tmpdir = Path(tmp)
        try:
            _pip_download(pkg, version, tmpdir)
        except PatchError as e:
            print(f"patches.py: {e}\npatches.py: trying PyPI directly", file=sys.stderr)
            _pypi_download(pkg, version, tmpdir)
        files = list(tmpdir.glob("*.tar.gz"))
        if len(files) != 1:
            raise PatchError(f"expected one sdist, got {[f.name for f in files]}")
        got = sha256_of(files[0])
        if got != want:
            raise PatchError(f"sha256 mismatch for {files[0].name}: got {got}, pinned {want}")
        os.replace(files[0], cached)
    return cached


def unpack_pristine(pin: dict[str, str]) -> None:
    """Create vendor/llama.cpp as a git repo whose first commit (tag `upstream`) is pristine."""
    sdist = fetch_sdist(pin)
    prefix = f"{pin['package'].replace('-', '_')}-{pin['version']}/{pin['subdir'].strip('/')}/"
    VENDOR.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".llama.cpp.", dir=VENDOR.parent))
    try:
        with tarfile.open(sdist) as tf:
            members = []
            for m in tf.getmembers():
                if not m.name.startswith(prefix) or m.name == prefix.rstrip("/"):
                    continue
                m.name = m.name[len(prefix):]
                parts = Path(m.name).parts
                # the sdist carries the submodule's `.git` link file; our repo replaces it
                if not m.name or m.name.startswith("/") or ".." in parts or parts[0] == ".git":
                    continue
                members.append(m)
            if hasattr(tarfile, "tar_filter"):
                tf.extractall(tmp, members=members, filter="tar")
            else:  # Python < 3.11.4
                tf.extractall(tmp, members=members)
        git("init", "-q", "-b", "kairox", cwd=tmp)
        git("add", "-A", "--force", ".", cwd=tmp)
        git("commit", "-q", "--no-verify", "-m",
            f"upstream: {pin['package']}=={pin['version']} {pin['subdir']}", cwd=tmp)
        git("tag", TAG, cwd=tmp)
        if VENDOR.exists():
            shutil.rmtree(VENDOR)
        os.replace(tmp, VENDOR)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def patch_files() -> list[Path]:
    return sorted(PATCHES.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def _am(patches: list[Path], cwd: Path) -> None:
    if not patches:
        return
    proc = subprocess.run(["git", "am", "-q", "--keep-cr", "--committer-date-is-author-date",
                           *map(str, patches)], cwd=cwd,
                          env=dict(os.environ, **GIT_ENV), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        subprocess.run(["git", "am", "--abort"], cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        raise PatchError("patches do not apply:\n" + proc.stdout.decode(errors="replace")[-3000:])


def is_dirty(cwd: Path = VENDOR) -> bool:
    return bool(git("status", "--porcelain", "--untracked-files=all", cwd=cwd).strip())


def cmd_apply(args: argparse.Namespace) -> int:
    pin = upstream_pin()
    if not (VENDOR / ".git").exists():
        print(f"patches.py: unpacking {pin['package']}=={pin['version']} into {VENDOR}")
        unpack_pristine(pin)
    elif is_dirty() and not args.force:
        raise PatchError(f"{VENDOR} has uncommitted edits; run `export` first or pass --force")
    head = git("rev-parse", "HEAD").strip()
    if git("rev-list", "--count", f"{TAG}..HEAD").strip() != "0":
        # never lose a developer's unexported commits: keep them reachable
        git("update-ref", f"refs/kairox-backup/{head[:12]}", head)
    git("checkout", "-q", "-B", "kairox", TAG)
    git("reset", "-q", "--hard", TAG)
    git("clean", "-q", "-fdx")
    _am(patch_files(), VENDOR)
    print(f"patches.py: applied {len(patch_files())} patch(es) on top of '{TAG}'")
    return 0


def _tree_of_worktree() -> str:
    """Tree hash of the vendor working tree as it is now, untracked files included."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git("read-tree", "HEAD", env=env)
        git("add", "-A", ".", env=env)
        return git("write-tree", env=env).strip()


def _tree_from_patches() -> str:
    """Tree hash that pristine + patches/ produce, built in a throwaway worktree."""
    with tempfile.TemporaryDirectory(prefix="kairox-check-") as tmp:
        wt = Path(tmp) / "wt"
        git("worktree", "add", "-q", "--detach", str(wt), TAG)
        try:
            _am(patch_files(), wt)
            return git("rev-parse", "HEAD^{tree}", cwd=wt).strip()
        finally:
            git("worktree", "remove", "--force", str(wt), check=False)
            git("worktree", "prune", check=False)


def cmd_check(args: argparse.Namespace) -> int:
    if not (VENDOR / ".git").exists():
        raise PatchError(f"{VENDOR} does not exist; run `python3 scripts/patches.py apply`")
    want = _tree_from_patches()
    have = _tree_of_worktree()
    if want != have:
        diff = git("diff", "--stat", want, have)
        print("patches.py check: vendor tree differs from pristine + patches/:\n" + diff
              + "\nrun `python3 scripts/patches.py export` to save vendor edits into patches/",
              file=sys.stderr)
        return 1
    print(f"patches.py check: ok ({len(patch_files())} patch(es))")
    return 0


def concerns() -> list[tuple[str, str, str]]:
    """(key, commit, subject) of each patch commit on top of upstream, oldest first."""
    out = []
    for line in git("log", "--reverse", "--format=%H %s", f"{TAG}..HEAD").splitlines():
        commit, subject = line.split(" ", 1)
        out.append((subject.split(":", 1)[0].strip(), commit, subject))
    return out


def _commit_into(key: str) -> None:
    """Commit the uncommitted vendor edits as a fixup of concern `key`'s commit."""
    match = [c for c in concerns() if c[0] == key and not c[2].startswith(("fixup!", "squash!", "amend!"))]
    if len(match) != 1:
        known = ", ".join(c[0] for c in concerns() if not c[2].startswith("fixup!"))
        raise PatchError(f"no single concern named '{key}' (concerns: {known})")
    git("add", "-A", ".")
    git("commit", "-q", "--no-verify", f"--fixup={match[0][1]}")


def _autosquash() -> None:
    """Fold fixup!/squash!/amend! commits into their targets (a non-interactive rebase)."""
    subjects = [c[2] for c in concerns()]
    if not any(s.startswith(("fixup!", "squash!", "amend!")) for s in subjects):
        return
    try:
        git("rebase", "-q", "-i", "--autosquash", TAG,
            env={"GIT_SEQUENCE_EDITOR": "true", "GIT_EDITOR": "true"})
    except PatchError:
        git("rebase", "--abort", check=False)
        raise
    left = [s for s in (c[2] for c in concerns()) if s.startswith(("fixup!", "squash!", "amend!"))]
    if left:
        raise PatchError(f"fixup commits without a target: {left}")


def cmd_export(args: argparse.Namespace) -> int:
    if not (VENDOR / ".git").exists():
        raise PatchError(f"{VENDOR} does not exist")
    if is_dirty():
        if args.into:
            _commit_into(args.into)
        elif args.new:
            if ":" not in args.new:
                raise PatchError("--new takes 'name: subject'")
            if any(c[0] == args.new.split(":", 1)[0].strip() for c in concerns()):
                raise PatchError(f"concern '{args.new.split(':', 1)[0].strip()}' exists; use --into")
            git("add", "-A", ".")
            git("commit", "-q", "--no-verify", "-m", args.new)
        else:
            keys = ", ".join(c[0] for c in concerns())
            raise PatchError("the vendor tree has uncommitted edits: name the concern they belong to with "
                             f"--into NAME ({keys}), or commit them with `git commit --fixup=<commit>`")
    _autosquash()
    with tempfile.TemporaryDirectory() as tmp:
        git("format-patch", "-q", "--zero-commit", "--no-signature", "--no-stat", "--full-index",
            "-o", tmp, f"{TAG}..HEAD")
        new = sorted(Path(tmp).glob("*.patch"))
        for old in patch_files():
            old.unlink()
        for p in new:
            shutil.copyfile(p, PATCHES / p.name)
    print(f"patches.py: exported {len(new)} patch(es) to {PATCHES}")
    return 0


def cmd_concerns(args: argparse.Namespace) -> int:
    if not (VENDOR / ".git").exists():
        raise PatchError(f"{VENDOR} does not exist; run `python3 scripts/patches.py apply`")
    for key, commit, subject in concerns():
        print(f"{key:12s} {commit[:12]}  {subject}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if not (VENDOR / ".git").exists():
        print("vendor tree: missing")
        return 0
    print(git("log", "--oneline", f"{TAG}..HEAD") or "(no commits on top of upstream)")
    print(git("status", "--short") or "(clean)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apply", help="pristine + patches -> vendor tree")
    a.add_argument("--force", action="store_true", help="discard uncommitted vendor edits")
    a.add_argument("--if-missing", action="store_true",
                   help="do nothing when the vendor tree already matches patches/ (build-time use)")
    e = sub.add_parser("export", help="vendor edits -> patches/ (one patch per concern)")
    g = e.add_mutually_exclusive_group()
    g.add_argument("--into", metavar="NAME",
                   help="fold uncommitted edits into concern NAME's patch (see `concerns`)")
    g.add_argument("--new", metavar="'NAME: SUBJECT'",
                   help="commit uncommitted edits as the patch of a new concern")
    sub.add_parser("check", help="fail when vendor tree and patches/ disagree")
    sub.add_parser("concerns", help="list the concerns (one per patch)")
    sub.add_parser("status", help="show patch commits and uncommitted edits")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "apply" and args.if_missing and (VENDOR / ".git").exists():
            if _tree_of_worktree() == _tree_from_patches():
                return 0
            if is_dirty():
                # a developer's work in progress: build it as it is, never discard it
                print("patches.py: vendor tree has edits not yet exported; building it as is",
                      file=sys.stderr)
                return 0
        return {"apply": cmd_apply, "export": cmd_export, "check": cmd_check,
                "concerns": cmd_concerns, "status": cmd_status}[args.cmd](args)
    except PatchError as e:
        print(f"patches.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
