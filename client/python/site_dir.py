"""Print where a package installed under PREFIX is on this python's path.

Used by client/python/meson.build at configure time: of this python's
default sys.path, the *-packages directories under PREFIX, the one with
the shortest path below it (Debian's python3 with PREFIX /usr lists
/usr/local/lib/python3.11/dist-packages and /usr/lib/python3/dist-packages:
the second is the distribution's place, the first /usr/local's). Prints
nothing when none is under PREFIX (a pyenv python and /usr/local): the
package then goes where meson's python module says, which that python
does not look at without PYTHONPATH.
"""
import os
import sys


def main():
    prefix = os.path.normpath(sys.argv[1])
    found = []
    for entry in sys.path:
        if not entry.endswith("-packages"):
            continue
        entry = os.path.normpath(entry)
        if entry.startswith(prefix + os.sep):
            rel = os.path.relpath(entry, prefix)
            found.append((len(rel.split(os.sep)), entry))
    if found:
        print(min(found)[1])


main()
