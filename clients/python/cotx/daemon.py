"""Moved: the launcher of a real daemon process is the test harness's `cotest.daemon`
(harness/cotest/daemon.py). Starting a daemon is what the tests, the demo and the
benchmarks do, not what a service's client does, so the shipped package no longer carries
it; this module only says where it went (it imports nothing, the harness least of all)."""
raise ImportError("cotx.daemon moved to the project's test harness: use cotest.daemon (harness/cotest/daemon.py, "
                  "installed by scripts/install-python-packages.sh); a service talks to a running daemon "
                  "with cotx.Coordinator")
