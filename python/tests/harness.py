"""What the script-style Python tests share (test_gpu.py, test_frontdoors_gpu.py, test_distributed.py): raises() and
Skip, and run_tests(), the loop of their main(), so that they run under plain python3 where pytest is missing."""

import re
import traceback


class Skip(Exception):
    """Raised by a test that cannot run here; run_tests counts it as skipped."""


class raises:
    """with raises(Error, match="^regex") or raises(Error, contains="text"): ... (pytest.raises without pytest). The
    error is kept in .value."""

    def __init__(self, error, match=None, contains=None):
        self.error, self.match, self.contains, self.value = error, match, contains, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, trace):
        if kind is None:
            raise AssertionError(f"expected {self.error.__name__}, nothing was raised")
        if not issubclass(kind, self.error):
            return False
        if self.match and not re.search(self.match, str(value)):
            raise AssertionError(f"{str(value)!r} does not match {self.match!r}")
        if self.contains and self.contains not in str(value):
            raise AssertionError(f"{str(value)!r} does not contain {self.contains!r}")
        self.value = value
        return True


def run_tests(namespace, argv):
    """Runs each test_* function of `namespace` (a module's globals()) whose name contains the argument of -k, in name
    order; prints PASS, SKIP or FAIL (with the traceback) per test, then the counts. Returns the exit status."""
    selected = argv[argv.index("-k") + 1] if "-k" in argv else ""
    passed = failed = skipped = 0
    for name, function in sorted((n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)):
        if selected not in name:
            continue
        try:
            function()
            passed += 1
            print(f"PASS {name}")
        except Skip as reason:
            skipped += 1
            print(f"SKIP {name}: {reason}")
        except Exception:  # noqa: BLE001 - report every test, then fail the run
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0
