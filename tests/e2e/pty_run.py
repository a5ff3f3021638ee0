"""Run a command (argv[1:]) with stdout and stderr on a pseudo-terminal, as
a user at a terminal would, and print everything it wrote, escaped
(repr), so the test sees cursor movements and carriage returns."""
import os
import pty
import subprocess
import sys

main, secondary = pty.openpty()
proc = subprocess.Popen(sys.argv[1:], stdout=secondary, stderr=secondary, stdin=secondary, close_fds=True)
os.close(secondary)
out = b""
while True:
    try:
        chunk = os.read(main, 65536)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
code = proc.wait()
print(repr(out.decode("utf-8", "replace")))
sys.exit(code)
