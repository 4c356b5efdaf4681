"""Run `flashsim` in the test's own process and capture what it prints."""
import contextlib
import io


def run_cli(argv):
    """(exit status, stdout, stderr) of `flashsim ARGV`, in this process."""
    from analysis.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:          # argparse's own errors
            rc = e.code
    return rc, out.getvalue(), err.getvalue()
