"""What fails in class, what the student sees, what to do: docs/class.md's runbook ("When something fails"; a
test keeps the two the same). Standard library only: it runs in Chameleon Jupyter and on the node."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    name: str
    sees: str
    todo: str

    def advice(self) -> str:
        return (f"What went wrong: {self.name} ({self.sees}).\nWhat to do: {self.todo}\n"
                "(docs/class.md, When something fails)")


RATE_LIMIT = Failure(
    "A build fails: the registry's rate limit",
    "`toomanyrequests: You have reached your pull rate limit` while an image builds or pulls",
    "Wait a few minutes and run the cell again; what was built is cached. For a whole class, log in to Docker Hub "
    "on the nodes (`docker login`), so that pulls count against an account's limit rather than the anonymous one.")
DISK_FULL = Failure(
    "A build fails: the disk is full", "`no space left on device`",
    "`docker system df` shows what holds the disk; `docker builder prune -f` frees the build cache. "
    "Then run the cell again.")
REGISTRY = Failure(
    "The class registry fails",
    "`~/images.log` says `images: FAILED` after `pulling this commit's images` (the registry does not answer, "
    "asks for a login, or lacks this tag: `not found`, `manifest unknown`)",
    "`bin/node-setup --build` builds every image on the node under the tag compose runs (slow: about half an hour); "
    "or, given the instructor's `make images-save` archive, copy it to `~/servelab-images.tar` and run "
    "`bin/node-setup` again: it loads the archive (minutes). Either way, start the services once `~/images.log` ends with `images: done`.")
ARCHIVE = Failure(
    "A prepared node's archive is of an earlier commit",
    "`~/images.log` says `not in ~/servelab-images.tar (saved at another commit)`, then `images: FAILED` (the "
    "snapshot was taken before a commit the class now runs, and no class registry has this commit's images)",
    "`bin/node-setup --build` builds what the archive lacks on the node, under the tag compose runs (slow: up to "
    "half an hour). Before the next class, the instructor pushes this commit's images (`make images-push`) or "
    "prepares the snapshot again at this commit.")
CHI_TIMEOUT = Failure(
    "python-chi times out", "`Timeout waiting for server to reach ACTIVE status` (`2_create_server_nvidia`, `9_ray_setup`)",
    "Run the cell again: it finds the same server and waits again. If it times out twice, look at the server in "
    "Horizon (Compute > Instances).")
SERVER_ERROR = Failure(
    "The server is in ERROR", "`... is in ERROR`",
    "Delete it in Horizon (Compute > Instances) and run the cell again. A second ERROR: treat the node as bad (below).")
INSTALL = Failure(
    "`apt` or Docker's install fails",
    "`UnexpectedExit` from `s.execute` with apt's message, often `Could not get lock /var/lib/dpkg/lock-frontend` "
    "(the node's own updates at first boot)",
    "Wait a minute and run the cell again; every command can run twice.")
BAD_NODE = Failure(
    "A bad node",
    "The GPU check lists fewer GPUs than the node type has, or `nvidia-smi` fails; or SSH never answers",
    "Put the student's netID and the node `servelab class status` shows for them in `REPLACE` in `1_create_lease` "
    "and run the instructors' cells: their lease is deleted and a new one booked on another node, from the next "
    "minute if one is free. The student runs `2_create_server_nvidia` again from the top.")
FLOATING_IP = Failure(
    "No floating IP for the server",
    "`associate_floating_ip` fails in `2_create_server_nvidia` or `9_ray_setup`: `Quota exceeded for resources: "
    "['floatingip']`, or a conflict where two students' servers took the same free address at once",
    "Run the cell again: it associates an address only where the server has none, and takes a new one. A quota "
    "error: the instructor releases the project's unused addresses (Horizon: Network > Floating IPs) or asks "
    "Chameleon's help desk for a quota of the servers that run at once.")
LEASE_ENDED = Failure(
    "The lease ends mid-lab",
    "SSH to the node stops answering (`NoValidConnectionsError`, `Connection reset`); `servelab class status` "
    "shows the lease `TERMINATED`",
    "Before it ends: extend it in Horizon (Reservations > Leases > Update Lease) where no lease holds the node next, "
    "or copy `results/` off the node (`11_delete_resources`). After: book a new lease, run `2_create_server_nvidia` "
    "and go on; hand in the records of both leases (the check holds them to both).")
TWO_LEASES = Failure(
    "Two leases with one name",
    "`Multiple leases found for name serve_system_<netID>` from `lease.get_lease`",
    "Delete the one you do not use in Horizon (Reservations > Leases: the one without your server) and run the cell "
    "again; the booking cell makes a lease only where none of that name is live.")
UNHEALTHY = Failure(
    "A container never turns healthy",
    "The wait for a service gives up; `docker compose ps` shows it `(unhealthy)` or restarting",
    "`docker compose logs SERVICE` says why; `servelab doctor --node` checks the GPUs, the toolkit and the models. "
    "A lost GPU (\"Failed to initialize NVML\") is fixed by `sudo systemctl restart docker`.")
NO_VIEW = Failure(
    "No view of where the class stands", "—",
    "`servelab class status NETID...` (or the status cell of `1_create_lease`): each student's lease, node, "
    "server, floating IP and where they stand. With `--progress` (the staff keys in `notebooks/staff_keys.pub`: "
    "instructors.md, *Before the class*), also the runs each node holds by notebook, the core path's stages done and "
    "the last run's time: who is stuck.")
RUNBOOK = (RATE_LIMIT, DISK_FULL, REGISTRY, ARCHIVE, CHI_TIMEOUT, SERVER_ERROR, INSTALL, BAD_NODE, FLOATING_IP,
           LEASE_ENDED, TWO_LEASES, UNHEALTHY, NO_VIEW)
# Words in a failed command's output that name its cause better than the step that failed.
SYMPTOMS = {"toomanyrequests": RATE_LIMIT, "no space left on device": DISK_FULL, "multiple leases found": TWO_LEASES}


@contextmanager
def step(failure: Failure, *kinds: type[BaseException]) -> Iterator[None]:
    """Print the runbook's advice when the step raises one of ``kinds``, then re-raise: the cell still stops. The advice
    is that of a symptom in the exception's message or its command's output (``SYMPTOMS``), else ``failure``'s."""
    try:
        yield
    except kinds as exc:
        # A failed `s.execute`: invoke's UnexpectedExit keeps what the command wrote.
        result = getattr(exc, "result", None)
        text = " ".join([str(exc), getattr(result, "stdout", ""), getattr(result, "stderr", "")]).lower()
        print(next((found for symptom, found in SYMPTOMS.items() if symptom in text), failure).advice())
        raise
