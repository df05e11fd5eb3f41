"""The test harness itself (`fencelock.testing`): server processes, the delaying proxy, primary and replica."""
