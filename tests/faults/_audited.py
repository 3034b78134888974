"""Run a module (``python _audited.py -m adaptd.cli serve ...``) under a Python audit
hook that records, in ``$ADAPTD_AUDIT_LOG``, every change the process makes under
``$ADAPTD_AUDIT_WATCH`` (open for writing, remove, rename, rmdir, mkdir, chmod,
chown, truncate, utime, link) and every unpickling (``pickle.find_class``, and any
call of ``pickle.load``/``loads``/``Unpickler``). The first line is ``audit on``.

The hook sees what the interpreter does on the process's behalf, whichever module
asks, so a test can show a daemon never touched a path it was sent.
"""

from __future__ import annotations

import os
import pickle
import runpy
import sys

_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
#: event -> indexes of its path arguments
_PATH_EVENTS = {
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (0, 1),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
    "shutil.move": (0, 1),
    "shutil.copyfile": (1,),
}


def main() -> None:
    log_fd = os.open(os.environ["ADAPTD_AUDIT_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    watch = os.path.normpath(os.environ["ADAPTD_AUDIT_WATCH"])
    cwd = os.getcwd()

    def note(text: str) -> None:
        os.write(log_fd, (text.replace("\n", " ") + "\n").encode(errors="replace"))

    def watched(path: object) -> bool:
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if not isinstance(path, str):
            return False  # an fd
        full = os.path.normpath(os.path.join(cwd, path))  # pure string work: no I/O here
        return full == watch or full.startswith(watch + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, _mode, flags = args
            if isinstance(flags, int) and flags & _WRITE and watched(path):
                note(f"open-for-write {path!r} flags={flags:#o}")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and watched(args[i]):
                    note(f"{event} {args[i]!r}")
        elif event == "pickle.find_class":
            note(f"pickle.find_class {args!r}")

    def spy(name: str, real):
        def called(*a, **kw):
            note(f"pickle.{name} called")
            return real(*a, **kw)

        return called

    for name in ("load", "loads", "Unpickler"):
        setattr(pickle, name, spy(name, getattr(pickle, name)))
    note("audit on")
    sys.addaudithook(hook)
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: _audited.py -m MODULE ARGS...")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
