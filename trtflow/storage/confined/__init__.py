"""Every file trtflow touches under the store and under build/ is touched here, and only here.

The store (``.trtflow`` or ``$TRTFLOW_STORE``) and the output folder (``build/``) may come from elsewhere: a cloned
repository can carry both, and a shared store or a remote cache folder is written by others. So trtflow acts there
only within these rules, each enforced by this module (and no other module opens those paths: see
``tests/reliability/test_confined.py``):

- A `Tree` is a folder opened once. Every path below it is walked from that descriptor one folder at a time with
  ``O_NOFOLLOW | O_DIRECTORY`` (``openat``), so a symbolic link anywhere below the root stops the walk with
  `Refused`, and a folder renamed or swapped during the walk cannot lead it elsewhere. The root itself may be a
  link when the user named it (``--store``, ``TRTFLOW_STORE``, ``--output-dir``); a root found by default in the
  working folder (``.trtflow``, ``build``) may not (``follow_root=False``).
- A file is read only if it is a regular file (``fstat`` after an ``O_NOFOLLOW | O_NONBLOCK`` open: a named pipe
  never blocks, a device or a socket is refused) and never past the cap of its kind (`Kind`).
- A file is written through a temporary file in the same folder (created with ``O_EXCL | O_NOFOLLOW``), fsynced,
  then renamed over the name: a link in the name's place is replaced, never followed. ``create`` is exclusive.
- A ledger is appended to only when it is a regular file, not a link, with one link, owned by this user
  (`append`); one that is not is moved aside (and said so), and a new one is made with ``O_EXCL``.
- chmod is ``fchmod`` on a descriptor opened without following links; delete is ``unlinkat`` relative to the
  parent's descriptor (a link is removed, never what it points to); a tree is removed without following links.
- Locks are ``flock`` on a descriptor opened here (never truncated, never through a link).
- A name read from a record (a manifest, the build index, a no-op record, refs, journal rows) becomes part of a
  path only after `check_name` / `check_relative`: no ``/`` (for a name), no ``..`` or ``.``, no NUL, no empty
  part, at most 255 bytes per part.

One file outside the store named by its path (the project's trust file, `-o` outputs, `init`'s recipe, the user's
keys, the model files a recipe names) is read and written by the same rules in `trtflow.userfiles`, whose
primitives (`Refused`, the exclusive temporary and rename of `write_in`, the bounded read) these trees use too.

The modules, one job each: `names` (what may become a path part, and `Refused`), `kinds` (the caps of the files
read), `walking` (a folder opened once and the walk below it; looking at entries), `reading`, `writing`,
`changing` (removing, renaming, linking, chmod), `locking` (``flock``), `database` (SQLite files), and
`tree` (`Tree`, all of them over one folder, and the helpers that make one).
"""
