"""The conformance suite (`fencelock.testing.conformance`) on every backend in `conftest.BACKENDS`, and the proof
that a third party can run it the documented way, in a project of its own."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Iterator

import pytest

from fencelock.testing import Deployment
from fencelock.testing.conformance import ConformanceSuite
from tests.conftest import BACKENDS, SharedDeployments


class TestConformance(ConformanceSuite):
    """Every test of the suite, once per backend: the shared deployment of that kind, and a new one for each test
    that pauses the service."""

    @pytest.fixture(params=list(BACKENDS))
    def deployment(self, request: pytest.FixtureRequest, shared_deployments: SharedDeployments) -> Deployment:
        return shared_deployments.get(request.param)

    @pytest.fixture
    def own_deployment(self, deployment: Deployment) -> Iterator[Deployment]:
        with BACKENDS[deployment.kind]() as own:
            yield own


SUITE_TESTS = sorted(name for name, _ in inspect.getmembers(ConformanceSuite) if name.startswith("test_"))

THIRD_PARTY = textwrap.dedent('''
    """A backend that fencelock does not know: its own Deployment subclass, the suite inherited as documented."""

    import pytest

    from fencelock.testing import Deployment
    from fencelock.testing.conformance import ConformanceSuite
    from fencelock.testing.servers import RedisServer


    class ThirdPartyDeployment(Deployment):
        """Written as a third party would: against its own server, knowing its own storage layout."""

        kind = "third-party"
        supports_fair = True

        def __init__(self, server):
            super().__init__(server.url)
            self.server = server
            self.raw = server.client()

        def holder(self, name):
            value = self.raw.get("fencelock:{%s}:lock" % name)
            return None if value is None else value.decode()

        def steal(self, name):
            self.raw.delete("fencelock:{%s}:lock" % name)

        def pause(self):
            self.server.pause()

        def resume(self):
            self.server.resume()

        def close(self):
            self.server.close()


    @pytest.fixture(scope="session")
    def my_service():
        with ThirdPartyDeployment(RedisServer().start()) as deployment:
            yield deployment


    class TestThirdParty(ConformanceSuite):
        @pytest.fixture
        def deployment(self, my_service):
            return my_service
''')


def test_a_third_party_collects_the_whole_suite_and_runs_it(pytester: pytest.Pytester) -> None:
    """In a project with no fencelock conftest, no markers and warnings as errors, in a fresh interpreter: the
    subclass collects every test of the suite, and a quick sample of them passes (the default `own_deployment`,
    `steal`, `pause`, fork, `tmp_path`, the loss signal)."""
    pytester.makepyfile(test_third_party=THIRD_PARTY)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider --strict-markers --strict-config\n"
                     "filterwarnings = error\n")
    sample = ["test_acquire_gives_a_fenced_lease", "test_no_repr_or_error_message", "test_bad_input_is_refused",
              "test_a_forked_child_never_releases", "test_sql_guard_rejects", "test_a_stolen_lock_is_noticed"]
    result = pytester.runpytest_subprocess("-k", " or ".join(sample), "-v")
    result.assert_outcomes(passed=len(sample), deselected=len(SUITE_TESTS) - len(sample))
    for test in sample:
        result.stdout.fnmatch_lines([f"*::TestThirdParty::{test}* PASSED*"])


def test_a_suite_without_a_deployment_says_what_is_missing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_forgot="""
        from fencelock.testing.conformance import ConformanceSuite

        class TestForgot(ConformanceSuite):
            pass
    """)
    result = pytester.runpytest("-k", "test_fences_strictly", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*must define a `deployment` fixture*"])
