"""The reference checks' tally: one PASS/FAIL line per check, SELF-CHECK
lines for comparisons proving they can fail, then "N passed, M failed"."""


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def self_check(self, ok, what):
        # Proves the harness, not the code under test: a success is not a
        # pass, but a failure means the check cannot be trusted, so it fails
        # the run.
        print(("SELF-CHECK ok " if ok else "SELF-CHECK FAILED ") + what, flush=True)
        if not ok:
            self.failed += 1
