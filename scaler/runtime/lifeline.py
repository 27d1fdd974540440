"""`python -m scaler.runtime.lifeline --parent PID [--remove DIR] -- COMMAND...`: run COMMAND so that it dies with PID.

`scaler up` starts each of its parts through this. Linux's PR_SET_PDEATHSIG makes the kernel send
the part SIGTERM when its parent dies, however it dies (kill -9 included), so no part outlives
`scaler up` and keeps serving or writing a store nobody watches. The request is made here, in the
new process before it becomes COMMAND (it survives exec), rather than in `preexec_fn`, which is
unsafe in a process with threads. If PID is already gone by then, COMMAND is not started at all.

With `--remove DIR` (the embedded NATS's temporary store) this process stays COMMAND's parent
instead of becoming it, and removes DIR after COMMAND has exited if its own parent died meanwhile:
`scaler up`, which removes it on a normal stop, is then gone. It passes its signals on to COMMAND
and ends as COMMAND ended (by the same signal), so whoever watches it sees COMMAND's exit.
Its parent's death comes as a signal of its own (PARENT_DIED), not SIGTERM, so that it is told
apart from a stop: the kernel sends it when the parent's *thread* exits, and in a process killed
with -9 the main thread may exit before the others (asyncio's child watchers), so that for a
moment this process belongs to a sibling thread and getppid() still names the dying parent.

Elsewhere than Linux there is no such request: the parts then outlive a `scaler up` killed with -9.
"""

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
PARENT_DIED = signal.SIGUSR1  # the parent's death, with --remove


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True


def command(parent: int, *argv: str, remove: str = "") -> list[str]:
    """The argv that runs `argv` through this module, tied to `parent`."""
    extra = ["--remove", remove] if remove else []
    return [sys.executable, "-m", "scaler.runtime.lifeline", "--parent", str(parent), *extra, "--", *argv]


def _supervise(argv: list[str], parent: int, remove: str) -> None:
    children: list[subprocess.Popen] = []
    stopping = orphaned = False

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            child.send_signal(signal.SIGTERM)

    def parent_died(signum: int, frame: object) -> None:
        nonlocal orphaned
        orphaned = True
        forward(signum, frame)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    signal.signal(PARENT_DIED, parent_died)
    die_with_parent(PARENT_DIED)
    if orphaned or os.getppid() != parent:  # it died before we could ask: nothing to start, DIR is ours to remove
        shutil.rmtree(remove, ignore_errors=True)
        sys.exit(1)
    # Inherited descriptors (the data dir's lock) go on to COMMAND: close_fds=False. preexec_fn is
    # safe here: this process has one thread.
    child = subprocess.Popen(argv, close_fds=False, preexec_fn=die_with_parent)
    children.append(child)
    if stopping:  # a signal that came before `children` had it was not passed on
        child.terminate()
    code = child.wait()
    if orphaned or os.getppid() != parent:
        shutil.rmtree(remove, ignore_errors=True)
    if code < 0:  # end the same way, so that our watcher sees what happened to COMMAND
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m scaler.runtime.lifeline", description=__doc__)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--remove", default="")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args()
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        p.error("no command")
    if a.remove:
        _supervise(argv, a.parent, a.remove)
    die_with_parent()
    if os.getppid() != a.parent:  # it died before we could ask
        sys.exit(1)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
