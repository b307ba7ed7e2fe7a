"""`python -m mha_trace`, and the `mha-trace` command's entry point.

A Ctrl-C or SIGTERM that comes while the command line is still being imported ends the run with
its one line and code, as one that comes later does (Python would print a KeyboardInterrupt
traceback, or die of SIGTERM without a word).
"""

import os
import signal


def _stopped_early(signum, frame):
    line, code = ((b"Error: terminated (SIGTERM)\n", 143) if signum == signal.SIGTERM
                  else (b"Error: interrupted (Ctrl-C)\n", 130))
    try:
        os.write(2, line)
    except OSError:  # no stderr to tell: the code still does
        pass
    os._exit(code)


def main():
    signal.signal(signal.SIGTERM, _stopped_early)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stopped_early)
    from mha_trace.cli import main as command_line  # puts its own handlers in place

    command_line()


if __name__ == "__main__":
    main()
