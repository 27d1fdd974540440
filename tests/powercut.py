"""A disk that loses what was not synced when its power is cut: the fault suite's LazyFS, on FUSE.

`PowerCutDisk(disk, mount)` mounts a file system at `mount` whose files live in the folder `disk`. As
LazyFS (github dsrhaslab/lazyfs) does, it passes every change of names through to `disk` at once
(create, mkdir, rename, link, unlink, rmdir, chmod, utimens), and keeps the data written to a file
(write, truncate, O_TRUNC) in its own memory until the file is synced: fsync or fdatasync writes that
file's data to `disk` (what Go's `File.Sync` and Python's `os.fsync` call). `cut()` is the power cut:
the file system's process killed -9, so what was not synced goes with its memory, as a machine's page
cache goes; `disk` keeps what was synced, and the file system mounted again (`start()`) shows only that.
The programs using the mount are killed first, as the power cut kills them too.

What it does not model, as LazyFS does not: a new name lost (a file created, renamed or removed is so
on `disk` at once, as if every directory were synced), and a write torn within a page. `disk` itself
is never cut: "synced" means written to it, not to the metal, and the test machine keeps its power.

    python -m tests.powercut DISK MOUNT     # serves until killed (SIGTERM: unmounts, writing nothing back)

It needs FUSE 3 (Debian's `fuse3`: libfuse3 and fusermount3; `ensure_fuse()` installs it when run as
root) and `mfusepy` (the `test` extra).
"""

import asyncio
import contextlib
import ctypes.util
import errno
import fcntl
import os
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 4096
ROOT = Path(__file__).resolve().parents[1]  # where `python -m tests.powercut` runs


class NoFuse(RuntimeError):
    """FUSE 3 is not there and could not be installed; the message says in one line how to get it."""


def ensure_fuse() -> None:
    """FUSE 3 on this machine: Debian's `fuse3` installed with apt-get when missing and this is root."""
    if not os.path.exists("/dev/fuse"):
        raise NoFuse("no /dev/fuse: run on a machine (or a container started with --device /dev/fuse) that has FUSE")
    if _have_fuse():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise NoFuse("FUSE 3 is missing: apt-get install fuse3 (as root)")
    apt_install("fuse3")
    if not _have_fuse():
        raise NoFuse("FUSE 3 is still missing after apt-get install fuse3")


def _have_fuse() -> bool:
    return ctypes.util.find_library("fuse3") is not None and shutil.which("fusermount3") is not None


def apt_install(*packages: str) -> None:
    """`apt-get install` as root, one at a time on this machine (tests run side by side), with an update of the
    package lists first when they are too old to find the packages."""
    with open("/tmp/scaler-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
            done = subprocess.run(install, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise NoFuse(f"apt-get install {' '.join(packages)} failed: {done.stderr.strip()[-300:]}")


@dataclass
class Unsynced:
    """A file's data as written since its last sync: its size, the pages written, and `floor`, the lowest size it
    had meanwhile (what `disk` holds past it was truncated away: it reads as zeros unless written again)."""

    size: int
    floor: int
    pages: dict[int, bytearray] = field(default_factory=dict)


class PowerCutFs:
    """The mfusepy operations: names passed through to `root`, data kept per inode until synced."""

    use_ns = True

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()  # the tables below; a file's data under its own lock
        self._unsynced: dict[int, Unsynced] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._open: dict[int, int] = {}  # inode -> handles open on it
        self._inode: dict[int, int] = {}  # handle (a descriptor on `root`) -> inode

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _file_lock(self, ino: int) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(ino, threading.Lock())

    # names and attributes: passed through

    def getattr(self, path: str, fh: int | None = None) -> dict:
        st = os.fstat(fh) if fh is not None else os.lstat(self._path(path))
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size")}
        attrs |= {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}
        attrs["st_blocks"] = st.st_blocks
        if stat.S_ISREG(st.st_mode) and (u := self._unsynced.get(st.st_ino)) is not None:
            attrs["st_size"], attrs["st_blocks"] = u.size, (u.size + 511) // 512
        return attrs

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._path(path), amode):
            raise OSError(errno.EACCES, "")
        return 0

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict, int]]:
        """Each entry with its inode number (an entry numbered 0 is skipped by readdir(3)) and its type."""
        here = os.lstat(self._path(path))
        out = [
            (".", {"st_ino": here.st_ino, "st_mode": here.st_mode}, 0),
            ("..", {"st_ino": 1, "st_mode": here.st_mode}, 0),
        ]
        with os.scandir(self._path(path)) as entries:
            for e in entries:
                out.append((e.name, {"st_ino": e.inode(), "st_mode": e.stat(follow_symlinks=False).st_mode}, 0))
        return out

    def readlink(self, path: str) -> str:
        return os.readlink(self._path(path))

    def mkdir(self, path: str, mode: int) -> int:
        return os.mkdir(self._path(path), mode)

    def rmdir(self, path: str) -> int:
        return os.rmdir(self._path(path))

    def symlink(self, target: str, source: str) -> int:
        return os.symlink(source, self._path(target))

    def link(self, target: str, source: str) -> int:
        return os.link(self._path(source), self._path(target))

    def chmod(self, path: str, mode: int) -> int:
        return os.chmod(self._path(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> int:
        return os.chown(self._path(path), uid, gid)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        return os.utime(self._path(path), ns=times) if times else os.utime(self._path(path))

    def statfs(self, path: str) -> dict:
        sv = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize")
        return {k: getattr(sv, k) for k in keys} | {"f_namemax": sv.f_namemax}

    def unlink(self, path: str) -> int:
        target = self._path(path)
        st = os.lstat(target)
        os.unlink(target)
        self._gone(st)
        return 0

    def rename(self, old: str, new: str) -> int:
        try:
            replaced = os.lstat(self._path(new))
        except FileNotFoundError:
            replaced = None
        os.rename(self._path(old), self._path(new))
        if replaced is not None:
            self._gone(replaced)
        return 0

    def _gone(self, st: os.stat_result) -> None:
        """A name removed: a file with no name left and no handle open has no data to keep."""
        if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            with self._lock:
                if not self._open.get(st.st_ino):
                    self._unsynced.pop(st.st_ino, None)
                    self._locks.pop(st.st_ino, None)

    # files: opened on `root`; their data kept here until synced

    def open(self, path: str, flags: int) -> int:
        return self._opened(os.open(self._path(path), _backing(flags)), flags)

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        return self._opened(os.open(self._path(path), _backing(flags) | os.O_CREAT, mode), flags)

    def _opened(self, fd: int, flags: int) -> int:
        ino = os.fstat(fd).st_ino
        with self._lock:
            self._open[ino] = self._open.get(ino, 0) + 1
            self._inode[fd] = ino
        if flags & os.O_TRUNC:
            self._truncate(fd, ino, 0)
        return fd

    def release(self, path: str, fh: int) -> int:
        nlink = os.fstat(fh).st_nlink
        with self._lock:
            ino = self._inode.pop(fh)
            self._open[ino] -= 1
            if not self._open[ino]:
                del self._open[ino]
                if nlink == 0:  # removed while open: its data goes with its last handle
                    self._unsynced.pop(ino, None)
                    self._locks.pop(ino, None)
        os.close(fh)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # a close writes nothing back: only a sync does

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        ino = self._inode[fh]
        with self._file_lock(ino):
            u = self._unsynced.get(ino)
            if u is None:
                return os.pread(fh, size, offset)
            end = min(offset + size, u.size)
            out = bytearray()
            while offset < end:
                n, at = divmod(offset, PAGE)
                take = min(end - offset, PAGE - at)
                out += self._page(fh, u, n)[at : at + take]
                offset += take
            return bytes(out)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        ino = self._inode[fh]
        with self._file_lock(ino):
            u = self._changing(fh, ino)
            done = 0
            while done < len(data):
                n, at = divmod(offset + done, PAGE)
                take = min(len(data) - done, PAGE - at)
                page = u.pages.get(n)
                if page is None:
                    page = u.pages[n] = bytearray(self._page(fh, u, n))
                page[at : at + take] = data[done : done + take]
                done += take
            u.size = max(u.size, offset + len(data))
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            self._truncate(fh, self._inode[fh], length)
            return 0
        fd = os.open(self._path(path), os.O_RDONLY)
        try:
            self._truncate(fd, os.fstat(fd).st_ino, length)
        finally:
            os.close(fd)
        return 0

    def _truncate(self, fd: int, ino: int, length: int) -> None:
        with self._file_lock(ino):
            u = self._changing(fd, ino)
            u.size, u.floor = length, min(u.floor, length)
            for n in [n for n in u.pages if n * PAGE >= length]:
                del u.pages[n]
            if (page := u.pages.get(length // PAGE)) is not None:
                page[length % PAGE :] = bytes(PAGE - length % PAGE)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        """The file's data written to `disk`: from now on a power cut keeps it."""
        ino = self._inode[fh]
        with self._file_lock(ino):
            u = self._unsynced.pop(ino, None)
            if u is None:
                return 0
            os.ftruncate(fh, min(u.floor, os.fstat(fh).st_size))
            for n, page in sorted(u.pages.items()):
                os.pwrite(fh, bytes(page[: max(0, min(PAGE, u.size - n * PAGE))]), n * PAGE)
            os.ftruncate(fh, u.size)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # names are on `disk` already

    def _changing(self, fd: int, ino: int) -> Unsynced:
        u = self._unsynced.get(ino)
        if u is None:
            size = os.fstat(fd).st_size
            u = self._unsynced[ino] = Unsynced(size=size, floor=size)
        return u

    def _page(self, fd: int, u: Unsynced, n: int) -> bytes:
        """Page `n` as the file now reads: as written, else from `disk` up to the floor, zeros past it."""
        if (page := u.pages.get(n)) is not None:
            return page
        valid = max(0, min(PAGE, min(u.floor, u.size) - n * PAGE))
        return os.pread(fd, valid, n * PAGE).ljust(PAGE, b"\0")


def _backing(flags: int) -> int:
    """How a file is opened on `disk`: for reading too (a page partly written is read first), never appending
    (FUSE gives every write its offset) nor truncating (a truncation is data, kept until synced)."""
    keep = flags & ~(os.O_ACCMODE | os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL)
    return keep | os.O_RDWR | os.O_CLOEXEC


class PowerCutDisk:
    """The file system as a process of its own, mounted at `mount` over the folder `disk`; `cut()` cuts its power."""

    def __init__(self, disk: str | Path, mount: str | Path) -> None:
        self.disk = Path(disk)
        self.mount = Path(mount)
        self.cuts = 0
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        ensure_fuse()
        self.disk.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.powercut", str(self.disk), str(self.mount), cwd=ROOT,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        async with asyncio.timeout(30):
            while not mounted(self.mount):
                if self._proc.returncode is not None:
                    said = (await self._proc.stderr.read()).decode(errors="replace").strip()[-800:]
                    raise RuntimeError(f"the power-cut file system did not mount {self.mount}: {said}")
                await asyncio.sleep(0.05)

    def unsynced(self) -> dict[str, tuple[int, int]]:
        """The files whose size on the mount is not their size on `disk`, with both: what a cut now would drop (a
        lower bound: data overwritten in place keeps the size)."""
        out = {}
        for folder, _, files in os.walk(self.disk):
            for name in files:
                on_disk = Path(folder) / name
                relative = on_disk.relative_to(self.disk)
                with contextlib.suppress(OSError):  # removed meanwhile
                    shown, kept = (self.mount / relative).stat().st_size, on_disk.stat().st_size
                    if shown != kept:
                        out[str(relative)] = (shown, kept)
        return out

    async def cut(self) -> None:
        """The power cut: the file system killed -9, its unsynced data with it; the mount left behind is taken down.
        Kill what has files open on it first, as the cut does."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await _unmount(self.mount)
        self.cuts += 1

    async def stop(self) -> None:
        """Unmount and stop (nothing written back: what was not synced is lost as in a cut)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await _unmount(self.mount)

    async def __aenter__(self) -> "PowerCutDisk":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def mounted(mount: Path) -> bool:
    """Whether something is mounted at `mount`, a file system whose process died included (its stat fails)."""
    where = str(mount.resolve()).replace(" ", "\\040")
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == where for line in mounts)


async def _unmount(mount: Path) -> None:
    for command in (["fusermount3", "-u", "-z", str(mount)], ["umount", "-l", str(mount)]):
        if not mounted(mount):
            return
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        await proc.wait()


def serve(disk: str, mount: str) -> None:
    import mfusepy  # loads libfuse3: only in the file system's own process

    # One thread: the kernel's requests served in order, each whole (the locks keep it right with more). A file
    # removed while open is removed at once (hard_remove), not hidden under another name until closed.
    ops = PowerCutFs(os.path.abspath(disk))
    mfusepy.FUSE(ops, mount, foreground=True, nothreads=True, fsname="powercut", hard_remove=True, use_ino=True)


if __name__ == "__main__":
    serve(*sys.argv[1:3])
