"""scripts/debian_packages.sh, the install's one way to Debian packages, against stand-ins
for `id`, `sudo` and `apt-get`: root runs apt-get itself, a user through sudo when a rule
allows it, and otherwise the script stops with a message naming the packages, running
nothing. (Run as a real non-root user, with and without a sudo rule: see the issue's note.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("openjdk-17-jdk-headless", "procps")

STUBS = {
    "id": '#!/bin/bash\n[ "$1" = "-u" ] && echo "$FAKE_UID"\n',
    "apt-get": '#!/bin/bash\necho "apt-get $* frontend=${DEBIAN_FRONTEND:-}" >>"$CALLS"\nexit "${FAKE_APT_STATUS:-0}"\n',
    "sudo": """#!/bin/bash
if [ "$1" = "-n" ] && [ "$2" = "-l" ]; then exit "$FAKE_SUDO_STATUS"; fi
echo "sudo $*" >>"$CALLS"
[ "$1" = "-n" ] && shift
while [[ "$1" == *=* ]]; do export "${1?}"; shift; done
exec "$@"
""",
}


def run_install(tmp_path: Path, *, uid: int, stubs: tuple[str, ...] = ("id", "apt-get", "sudo"),
                sudo_status: int = 0, apt_status: int = 0) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`install_debian_packages` with only the given stand-ins on PATH (no terminal)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in stubs:
        (bin_dir / name).write_text(STUBS[name])
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": str(bin_dir), "CALLS": str(calls), "FAKE_UID": str(uid), "FAKE_SUDO_STATUS": str(sudo_status),
           "FAKE_APT_STATUS": str(apt_status), "HOME": str(tmp_path)}
    script = f'source scripts/debian_packages.sh && install_debian_packages "Java 17 for Spark" {" ".join(PACKAGES)}'
    completed = subprocess.run(["/bin/bash", "-c", script], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=30, check=False)
    return completed, calls.read_text().splitlines() if calls.exists() else []


def test_root_runs_apt_get_itself(tmp_path):
    completed, calls = run_install(tmp_path, uid=0)
    assert completed.returncode == 0, completed.stderr
    assert calls == ["apt-get update -qq frontend=noninteractive",
                     f"apt-get install -y -qq {' '.join(PACKAGES)} frontend=noninteractive"]


def test_a_user_with_a_sudo_rule_runs_apt_get_through_sudo(tmp_path):
    completed, calls = run_install(tmp_path, uid=1000)
    assert completed.returncode == 0, completed.stderr
    assert calls[0] == "sudo -n DEBIAN_FRONTEND=noninteractive apt-get update -qq"
    assert calls[1] == "apt-get update -qq frontend=noninteractive"
    assert calls[-1] == f"apt-get install -y -qq {' '.join(PACKAGES)} frontend=noninteractive"
    assert "with apt-get as sudo -n" in completed.stdout


@pytest.mark.parametrize(("case", "reason"), [
    ({"sudo_status": 1}, "sudo does not let this user run apt-get without a password"),
    ({"stubs": ("id", "apt-get")}, "sudo is not installed"),
    ({"stubs": ("id", "sudo")}, "this machine has no apt-get"),
])
def test_a_user_without_root_gets_the_packages_named_and_nothing_runs(tmp_path, case, reason):
    completed, calls = run_install(tmp_path, uid=1000, **case)
    assert completed.returncode == 1
    assert calls == []
    assert f"cannot install the Debian packages {' '.join(PACKAGES)} (Java 17 for Spark): " in completed.stderr
    assert f"{reason}." in completed.stderr
    assert f"sudo apt-get install {' '.join(PACKAGES)}" in completed.stderr


def test_a_failing_apt_get_is_reported_with_the_packages(tmp_path):
    completed, calls = run_install(tmp_path, uid=0, apt_status=100)
    assert completed.returncode == 1 and calls == ["apt-get update -qq frontend=noninteractive"]
    assert "apt-get failed (above)" in completed.stderr and " ".join(PACKAGES) in completed.stderr


def test_install_installs_debian_packages_only_through_the_function():
    text = (ROOT / "scripts" / "install.sh").read_text()
    assert "source scripts/debian_packages.sh" in text
    assert "apt-get" not in text.replace("install_debian_packages", "").replace("missing_debian_packages", "")
    assert os.access(ROOT / "scripts" / "install.sh", os.R_OK)


def missing_packages(tmp_path: Path, *arguments: str, commands: tuple[str, ...], initdb: bool) -> list[str]:
    """What `missing_debian_packages` names on a machine with only `commands` on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in commands:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    server = tmp_path / "postgresql" / "15" / "bin"
    if initdb:
        server.mkdir(parents=True, exist_ok=True)
        (server / "initdb").write_text("")
    env = {"PATH": str(bin_dir), "INITDB_GLOB": str(tmp_path / "postgresql" / "*" / "bin" / "initdb")}
    script = f"source scripts/debian_packages.sh && missing_debian_packages {' '.join(arguments)}"
    done = subprocess.run(["/bin/bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=30, check=True)
    return done.stdout.split()


def test_the_demo_installs_neither_chromium_nor_postgresql(tmp_path):
    assert missing_packages(tmp_path, commands=(), initdb=False) == ["openjdk-17-jdk-headless", "procps"]
    assert missing_packages(tmp_path, commands=("java", "javac", "jar"), initdb=False) == []


def test_the_tests_add_chromium_and_postgresql_when_missing(tmp_path):
    assert missing_packages(tmp_path, "--for-tests", commands=("java", "javac", "jar"), initdb=False) == [
        "chromium", "postgresql"]
    assert missing_packages(tmp_path, "--for-tests", commands=("java", "javac", "jar", "chromium"),
                            initdb=True) == []


def test_the_test_command_asks_for_the_test_packages_and_the_demo_does_not():
    assert "bash scripts/install.sh --for-tests" in (ROOT / "scripts" / "test.sh").read_text()
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert "bash scripts/install.sh\n" in demo and "--for-tests" not in demo
