"""What a notebook step prints when it fails (servelab.run.walkthrough.runbook, and the steps of
servelab.run.walkthrough.chameleon that use it), against autospec doubles of the installed python-chi and
invoke's own failure: the words are docs/class.md's runbook table, row for row."""

from __future__ import annotations

import re
from unittest import mock

import chi.exception
import chi.server
import pytest
from invoke.exceptions import UnexpectedExit
from invoke.runners import Result

from servelab.core.paths import REPO_ROOT
from servelab.run.walkthrough import chameleon, runbook
from servelab.run.walkthrough.common import wait_until


def failed(command: str, stdout: str = "", stderr: str = "") -> UnexpectedExit:
    """What ``Server.execute`` raises for a command that exits 1 (fabric runs it with invoke)."""
    return UnexpectedExit(Result(stdout=stdout, stderr=stderr, command=command, exited=1))


def a_server(status: str = "ACTIVE") -> mock.Mock:
    s = mock.create_autospec(chi.server.Server, instance=True)
    s.name, s.status = "node-serve-system-ab1234", status
    return s


def test_docs_class_md_holds_the_runbook_row_for_row() -> None:
    text = (REPO_ROOT / "docs" / "class.md").read_text(encoding="utf-8")
    header = text.index("| Failure | What the student sees | What to do |")
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", text[header:].split("\n\n", 1)[0], re.MULTILINE)
    assert rows[1:] == [(f.name, f.sees, f.todo) for f in runbook.RUNBOOK]


@pytest.mark.parametrize(("output", "expected"), [
    ("E: Could not get lock /var/lib/dpkg/lock-frontend", runbook.INSTALL),
    ("toomanyrequests: You have reached your pull rate limit", runbook.RATE_LIMIT),
    ("write /var/lib/docker/tmp/x: No space left on device", runbook.DISK_FULL),
], ids=["apt-lock", "rate-limit", "disk-full"])
def test_a_failed_command_stops_the_step_with_the_advice_its_output_calls_for(output: str, expected, capsys) -> None:
    s = a_server()
    s.execute.side_effect = [None, failed("sudo apt-get install -y -q nvtop", stderr=output), None]
    with pytest.raises(UnexpectedExit):
        chameleon.run(s, ["true", "sudo apt-get install -y -q nvtop", "never run"])
    assert s.execute.call_args_list == [mock.call("true"), mock.call("sudo apt-get install -y -q nvtop")]
    shown = capsys.readouterr().out
    assert shown.startswith(f"What went wrong: {expected.name} ") and f"What to do: {expected.todo}" in shown


def test_a_failed_gpu_check_says_the_node_is_bad(capsys) -> None:
    s = a_server()
    s.execute.side_effect = failed("nvidia-smi", stdout="NVIDIA-SMI has failed because it couldn't communicate")
    with pytest.raises(UnexpectedExit):
        chameleon.run(s, ["nvidia-smi"], runbook.BAD_NODE)
    assert runbook.BAD_NODE.todo in capsys.readouterr().out


def test_python_chi_s_timeout_says_run_the_cell_again(capsys) -> None:
    s = a_server(status="BUILD")
    s.wait.side_effect = chi.exception.ServiceError("Timeout waiting for server to reach ACTIVE status")
    with pytest.raises(chi.exception.ServiceError, match="Timeout waiting"):
        chameleon.wait_active(s)
    s.wait.assert_called_once_with(status="ACTIVE")
    assert "What to do: Run the cell again: it finds the same server and waits again." in capsys.readouterr().out


def test_a_server_in_error_says_delete_it_and_an_active_one_says_nothing(capsys) -> None:
    with pytest.raises(RuntimeError, match="node-serve-system-ab1234 is in ERROR"):
        chameleon.wait_active(a_server(status="ERROR"))
    assert runbook.SERVER_ERROR.todo in capsys.readouterr().out
    chameleon.wait_active(a_server())
    assert capsys.readouterr().out == ""


def test_ssh_that_never_answers_says_the_node_is_bad_and_no_second_address_is_taken(capsys) -> None:
    s = a_server()
    s.get_floating_ip.return_value = "192.0.2.10"  # a second run: the server has its address already
    assert chameleon.reach(s) == "192.0.2.10"
    s.associate_floating_ip.assert_not_called()
    s.check_connectivity.side_effect = chi.exception.ResourceError("Timeout waiting for 192.0.2.10:22")
    with pytest.raises(chi.exception.ResourceError):
        chameleon.reach(s)
    assert runbook.BAD_NODE.todo in capsys.readouterr().out


def test_an_error_the_step_does_not_expect_goes_on_without_advice(capsys) -> None:
    with pytest.raises(KeyError), runbook.step(runbook.INSTALL, UnexpectedExit):
        raise KeyError("not a command's failure")
    assert capsys.readouterr().out == ""


def test_a_service_that_never_answers_says_how_to_find_out_why(capsys) -> None:
    with pytest.raises(TimeoutError, match="waited 0 s for the FastAPI server; still: connection refused"):
        wait_until("the FastAPI server", lambda: "connection refused", "ready", wait_s=0, interval_s=0.01)
    assert f"What to do: {runbook.UNHEALTHY.todo}" in capsys.readouterr().out


def test_a_floating_ip_refused_says_so(capsys) -> None:
    s = a_server()
    s.get_floating_ip.return_value = None
    s.associate_floating_ip.side_effect = RuntimeError("Quota exceeded for resources: ['floatingip'].")
    with pytest.raises(RuntimeError):
        chameleon.reach(s)
    assert capsys.readouterr().out.startswith(f"What went wrong: {runbook.FLOATING_IP.name} ")
    s.check_connectivity.assert_not_called()


def test_a_node_lost_mid_command_says_the_lease_may_have_ended(capsys) -> None:
    s = a_server()
    s.execute.side_effect = ConnectionResetError("Connection reset by peer")
    with pytest.raises(ConnectionResetError):
        chameleon.run(s, ["docker compose up -d"])
    assert capsys.readouterr().out.startswith(f"What went wrong: {runbook.LEASE_ENDED.name} ")


def test_two_leases_of_one_name_say_which_to_delete(capsys) -> None:
    with mock.patch("chi.lease.get_lease", autospec=True,
                    side_effect=chi.exception.ResourceError("Multiple leases found for name serve_system_ab1234")):
        with pytest.raises(chi.exception.ResourceError):
            chameleon.the_lease("serve_system_ab1234")
    assert runbook.TWO_LEASES.todo in capsys.readouterr().out
