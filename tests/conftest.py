"""Settings shared by the whole suite."""

from hypothesis import settings

# Property tests draw the same examples on every run and machine: a failure is reproduced by running the test
# again, and a pass never depends on luck. No example database either, so nothing is written into the
# repository and one run's failures do not steer the next. No deadline: on a busy shared CPU an example's time
# says nothing about the code, and a deadline would fail at random.
settings.register_profile("mtx", derandomize=True, database=None, deadline=None)
settings.load_profile("mtx")
