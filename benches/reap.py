"""Runs a command as a child subreaper and reports the CPU of its WHOLE process tree.

Usage: python3 reap.py <out-file> <command> [args...]

Why not /usr/bin/time alone: rusage counts a process's CPU in its parent only once the
parent has waited for it. At shutdown Chromium's zygote (and, through it, every renderer it
forked) is orphaned and reparented to init, which reaps it: /usr/bin/time then misses the
renderers' CPU. Marked as a child subreaper (prctl PR_SET_CHILD_SUBREAPER), this process
receives those orphans instead of init, waits for them, and so RUSAGE_CHILDREN holds the CPU
of every process the command ever started.

Writes one line to <out-file>: "<elapsed_s> <user_s> <sys_s> <max_single_rss_kb> <exit> <stragglers>"
where stragglers counts descendants still alive 10 s after the command itself exited
(they are killed, then reaped). Exits with the command's exit status.
"""
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    t0 = time.monotonic()
    main_child = subprocess.Popen(argv)
    status = None
    deadline = None
    stragglers = 0
    while True:
        try:
            if deadline is not None and time.monotonic() > deadline:
                # Descendants outliving the command by 10 s: count, kill, and reap them.
                for pid in children_of(os.getpid()):
                    stragglers += 1
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                deadline = float("inf")
            flags = os.WNOHANG if deadline is not None else 0
            pid, st = os.waitpid(-1, flags)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
            continue
        if pid == main_child.pid:
            status = os.waitstatus_to_exitcode(st)
            deadline = time.monotonic() + 10
    elapsed = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        f.write(
            f"{elapsed:.3f} {ru.ru_utime:.3f} {ru.ru_stime:.3f} {ru.ru_maxrss} {status} {stragglers}\n"
        )
    return status if status is not None and status >= 0 else 1


def children_of(ppid: int) -> list[int]:
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2 :].split()
        if int(fields[1]) == ppid:
            kids.append(int(name))
    return kids


if __name__ == "__main__":
    sys.exit(main())
