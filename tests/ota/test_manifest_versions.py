"""Which release is newer: Semantic Versioning 2.0.0 precedence (semver.org, item 11), as the agent's
checks (`verify`: not newer, agent too old) apply it. No Docker engine needed."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from edge_runtime import __version__
from edge_runtime.ota.manifest import Manifest, ManifestRefused, generate_keypair, parse, sign, verify, version_key
from tests.ota.test_manifest_bounds import IMAGE, _agent

# The precedence example of the specification, lowest first, and more edges of item 11.
ORDERED = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11",
           "1.0.0-rc.1", "1.0.0", "1.0.1-0", "1.0.1-9", "1.0.1-10", "1.0.1-a", "1.0.1-a.0", "1.0.1", "1.2.0-rc.1",
           "1.2.0-rc.2", "1.2.0-rc.10", "1.2.0", "1.10.0", "2.0.0-rc.1", "2.0.0"]


def test_versions_compare_by_semver_precedence() -> None:
    for lower, higher in itertools.combinations(ORDERED, 2):
        assert version_key(lower) < version_key(higher), (lower, higher)
        assert not version_key(higher) <= version_key(lower), (lower, higher)


def test_build_metadata_is_ignored() -> None:
    assert version_key("1.2.0+build.7") == version_key("1.2.0+build.8") == version_key("1.2.0")
    assert version_key("1.2.0-rc.1+exp.sha.5114f85") == version_key("1.2.0-rc.1")
    assert version_key("1.2.0-rc.1+b") < version_key("1.2.0+a")


@pytest.mark.parametrize("bad", ["1.2", "v1.2.0", "01.2.0", "1.2.0-01", "1.2.0-rc..1", "1.2.0-", "1.2.0+", "latest"])
def test_what_is_not_a_semantic_version_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        version_key(bad)
    with pytest.raises(ManifestRefused, match="version"):
        parse({"image": IMAGE, "version": bad})


def _signed(private: str, version: str, min_agent: str | None = None) -> Manifest:
    return sign(Manifest(image=IMAGE, version=version, min_agent_version=min_agent), private)


@pytest.mark.parametrize(("running", "offered"), [
    ("1.2.0-rc.1", "1.2.0"),  # the final release after its release candidate
    ("1.2.0-rc.1", "1.2.0-rc.2"),
    ("1.2.0-rc.9", "1.2.0-rc.10"),  # numerically, not as text
    ("1.0.0-alpha.1", "1.0.0-alpha.beta"),  # numeric identifiers before alphanumeric ones
    ("1.0.0-alpha", "1.0.0-alpha.1"),  # more fields, all else equal
])
def test_a_newer_pre_release_or_the_final_release_is_applied(running: str, offered: str) -> None:
    private, public = generate_keypair()
    verify(_signed(private, offered), [public], running, "0.1.0")
    with pytest.raises(ManifestRefused, match="not newer"):  # and the way back is a downgrade
        verify(_signed(private, running), [public], offered, "0.1.0")


@pytest.mark.parametrize(("running", "offered"), [("1.2.0", "1.2.0-rc.2"), ("1.2.0-rc.2", "1.2.0-rc.2+rebuilt"),
                                                  ("1.2.0+a", "1.2.0+b")])
def test_a_pre_release_of_the_running_release_or_the_same_precedence_is_not_newer(running: str, offered: str) -> None:
    private, public = generate_keypair()
    with pytest.raises(ManifestRefused, match="not newer"):
        verify(_signed(private, offered), [public], running, "0.1.0")
    verify(_signed(private, offered), [public], running, "0.1.0", allow_downgrade=True)


def test_min_agent_version_compares_pre_releases_too() -> None:
    private, public = generate_keypair()
    with pytest.raises(ManifestRefused, match=r"needs agent 0\.2\.0 or newer"):
        verify(_signed(private, "2.0.0", min_agent="0.2.0"), [public], "1.0.0", "0.2.0-rc.1")
    verify(_signed(private, "2.0.0", min_agent="0.2.0-rc.1"), [public], "1.0.0", "0.2.0-rc.1")
    verify(_signed(private, "2.0.0", min_agent="0.2.0-rc.1"), [public], "1.0.0", "0.2.0")


def test_a_running_version_that_is_not_semver_is_refused_with_a_reason(tmp_path: Path) -> None:
    # A container label such as "latest" raised ValueError out of verify(): no refusal was reported.
    private, public = generate_keypair()
    with pytest.raises(ManifestRefused, match="the running version 'latest' is not a semantic version"):
        verify(_signed(private, "2.0.0"), [public], "latest", "0.1.0")
    verify(_signed(private, "2.0.0"), [public], "latest", "0.1.0", allow_downgrade=True)


def test_the_agent_takes_the_final_release_after_its_release_candidate(tmp_path: Path) -> None:
    # The state file says 1.2.0-rc.1 runs (no container to ask): 1.2.0 must get past the checks.
    private, public = generate_keypair()
    agent, statuses = _agent(tmp_path, public)
    (tmp_path / "state.json").write_text(json.dumps({"phase": "idle", "version": "1.2.0-rc.1"}))
    agent.handle(_signed(private, "1.2.0").model_dump_json(exclude_none=True))
    assert [s["phase"] for s in statuses] == ["received", "failed"]  # past verify: no container to update here
    assert statuses[-1]["reason"] == "no container named 'edge' to update"



def test_the_versions_this_repository_ships_are_semantic_versions() -> None:
    # The agent compares its own version (`min_agent_version`) and the image's version label (the running
    # version) with version_key: one that is not SemVer 2.0.0 would refuse every manifest (the label) or
    # raise out of verify (the agent's), so the package version and every image's VERSION default must parse.
    root = Path(__file__).resolve().parents[2]
    pyproject = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    bake = re.search(r'variable "VERSION" \{ default = "([^"]+)" \}',
                     (root / "l4t_docker" / "docker-bake.hcl").read_text())
    assert pyproject is not None and bake is not None
    shipped = {"edge_runtime.__version__": __version__, "pyproject.toml": pyproject.group(1),
               "docker-bake.hcl": bake.group(1)}
    for path in sorted((root / "l4t_docker").glob("Dockerfile.*")):
        for default in re.findall(r"^ARG VERSION=(\S+)", path.read_text(), re.M):
            shipped[path.name] = default
    assert len(shipped) >= 6, shipped  # the package twice, the bake file, three Dockerfiles
    for where, version in shipped.items():
        try:
            key = version_key(version)
        except ValueError:
            pytest.fail(f"{where}: {version!r} is not a semantic version")
        assert str(key) == version, where
