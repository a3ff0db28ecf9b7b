"""``plugmq console`` in a real browser: headless Chromium (Debian's) driven by selenium.

A live two-broker cluster on a real ZooKeeper (``plugmq serve`` children with ACL and the trace
plugin), traffic from the official RocketMQ 5 Python client, and ``plugmq console`` as a child
process. Every page renders; a wrong password is refused; the DLQ re-drive puts dead letters back
where the group consumes them again. With ``PLUGMQ_CONSOLE_SCREENSHOTS=DIR`` each page is saved
at 1280x800 in DIR (``docs/screenshots`` in the repository).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")
pytest.importorskip("starlette", reason="needs the console extra (starlette, jinja2, uvicorn)")
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the test extra)")

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.expected_conditions import staleness_of  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

from plugmq.server.admin import AdminClient  # noqa: E402
from plugmq.testing import CLUSTER_PLUGINS, ServeProcess, ZooKeeperServer, write_broker_config  # noqa: E402
from plugmq.testing import wait_for as poll  # noqa: E402

WAIT_S = 30.0
TOPIC = "Orders"
ADMIN, ADMIN_SECRET = "ops", "ops-secret"
APP, APP_SECRET = "app", "app-secret"
SERVER_EXTRA = f"""
[server.acl]
enabled = true
[server.acl.accounts.{ADMIN}]
secret = "{ADMIN_SECRET}"
publish = ["*"]
subscribe = ["*"]
groups = ["*"]
admin = true
[server.acl.accounts.{APP}]
secret = "{APP_SECRET}"
publish = ["*"]
subscribe = ["*"]
groups = ["billing", "fragile"]
[groups.fragile]
max_delivery_attempts = 1
"""
_CLI = "from plugmq.cli import main; main()"


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    poll(predicate, timeout_s, what)


class Rig:
    """The cluster, its traffic, and the console in front of it."""

    def __init__(self, zookeeper: ZooKeeperServer, directory: Path) -> None:
        self.directory = directory
        self.brokers: dict[str, ServeProcess] = {}
        for name in ("broker-a", "broker-b"):
            config = write_broker_config(directory, name, zookeeper=zookeeper.hosts, cluster="console-c",
                                         extra=SERVER_EXTRA, plugins=[*CLUSTER_PLUGINS, "trace"])
            self.brokers[name] = ServeProcess(config)
        self.addresses = {name: process.await_address() for name, process in self.brokers.items()}
        self.console: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.ids: list[str] = []  # what the producer sent
        self.dead_ids: list[str] = []  # what group fragile received and let time out (its only attempt)

    def admin(self, broker: str, verb: str, **args: Any) -> Any:
        with AdminClient(self.addresses[broker], access_key=ADMIN, secret_key=ADMIN_SECRET) as client:
            return client.call(verb, args)

    def client_config(self) -> ClientConfiguration:
        return ClientConfiguration(self.addresses["broker-a"], Credentials(APP, APP_SECRET), request_timeout=5)

    def start_console(self) -> None:
        log = open(self.directory / "console.log", "ab")  # noqa: SIM115 - the child holds it; closed with the rig
        self._console_log = log
        self.console = subprocess.Popen(
            [sys.executable, "-c", _CLI, "console", "--server", self.addresses["broker-a"], "--listen",
             "127.0.0.1:0", "--sample-s", "1"], stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        assert self.console.stdout is not None
        line = self.console.stdout.readline().decode()
        assert line.startswith("plugmq console: listening on "), f"console did not start: {line!r}"
        self.url = line.split()[4]

    def stop(self) -> None:
        if self.console is not None and self.console.poll() is None:
            os.kill(self.console.pid, signal.SIGTERM)
            try:
                self.console.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.console.kill()
                self.console.wait()
        if self.console is not None:
            self._console_log.close()
        for process in self.brokers.values():
            process.stop()


def send(rig: Rig, count: int) -> list[str]:
    producer = Producer(rig.client_config(), (TOPIC,))
    producer.startup()
    try:
        ids = []
        for i in range(count):
            message = Message()
            message.topic, message.body, message.keys = TOPIC, f"order {i}: 2 widgets".encode(), f"order-{i}"
            ids.append(producer.send(message).message_id)
        return ids
    finally:
        producer.shutdown()


class SteadyTraffic:
    """A producer sending a message every ``pace_s`` until stopped (at most ``limit``), so the console's
    samples see topics grow while the pages are open."""

    def __init__(self, rig: Rig, pace_s: float = 0.1, limit: int = 3000) -> None:
        self._producer = Producer(rig.client_config(), (TOPIC,))
        self._stop = threading.Event()
        self._pace, self._limit = pace_s, limit
        self._thread = threading.Thread(target=self._run, name="console-test-traffic", daemon=True)
        self.sent = 0

    def __enter__(self) -> SteadyTraffic:
        self._producer.startup()
        self._thread.start()
        return self

    def _run(self) -> None:
        while self.sent < self._limit and not self._stop.wait(self._pace):
            message = Message()
            message.topic, message.body, message.keys = TOPIC, f"steady {self.sent}".encode(), f"steady-{self.sent}"
            self._producer.send(message)
            self.sent += 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=WAIT_S)
        self._producer.shutdown()


def consumer(rig: Rig, group: str) -> SimpleConsumer:
    made = SimpleConsumer(rig.client_config(), group, {TOPIC: FilterExpression()}, await_duration=2)
    made.startup()
    return made


@pytest.fixture(scope="module")
def rig(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    made = Rig(zookeeper, tmp_path_factory.mktemp("console"))
    try:
        for broker in made.brokers:  # each broker sees the other before a client asks for a route
            wait_for(functools.partial(_sees_both, made, broker), f"{broker} sees both")
        made.admin("broker-a", "cluster-update-topic", topic=TOPIC, queue_count=2, cluster="console-c")
        made.ids = send(made, 24)
        billing = consumer(made, "billing")
        fragile = consumer(made, "fragile")
        try:
            got: list[Any] = []
            wait_for(functools.partial(_receive_into, billing, got, 60, 20), "billing receives 20")
            for message in got[:14]:
                billing.ack(message)  # the rest stay in flight for a minute
            dead: list[Any] = []
            wait_for(functools.partial(_receive_into, fragile, dead, 1, 8), "fragile receives 8")
            made.dead_ids = sorted({m.message_id for m in dead})
        except BaseException:
            billing.shutdown()
            raise
        finally:
            fragile.shutdown()
        # fragile's only attempt times out unacked: every received message is dead-lettered.
        wait_for(lambda: sum(len(made.admin(b, "dlq-browse", group="fragile")["messages"])
                             for b in made.brokers if _has_dlq(made, b)) >= len(made.dead_ids),
                 "fragile's dead letters")
        made.start_console()
        try:  # billing's consumer stays connected (a client on the group's page), with traffic going on
            with SteadyTraffic(made):
                yield made
        finally:
            billing.shutdown()
    finally:
        made.stop()


def _sees_both(rig: Rig, broker: str) -> bool:
    return len(rig.admin(broker, "cluster-list")["brokers"]) == 2


def _receive_into(consumer: SimpleConsumer, into: list[Any], invisible_s: int, enough: int) -> bool:
    into.extend(consumer.receive(16, invisible_s))
    return len(into) >= enough


def _has_dlq(rig: Rig, broker: str) -> bool:
    return any(t["topic"] == "%DLQ%fragile" for t in rig.admin(broker, "topic-list"))


def shot(browser: Any, name: str) -> None:
    directory = os.environ.get("PLUGMQ_CONSOLE_SCREENSHOTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(Path(directory) / f"{name}.png"))


def text(browser: Any, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def submit(browser: Any, button_id: str) -> None:
    """Click a form's button and wait until the answer replaced the page (a click returns before).

    chromedriver now and then fails a click with "Node with given id does not belong to the
    document" (its node ids went stale under it). The button is then found and clicked again,
    unless the page was replaced already (the click went through)."""
    page = browser.find_element(By.TAG_NAME, "html")
    for attempt in range(3):
        try:
            browser.find_element(By.ID, button_id).click()
            break
        except WebDriverException as exc:
            if "does not belong to the document" not in str(exc) or attempt == 2:
                raise
            if staleness_of(page)(browser):
                break  # the click went through: the answer replaced the page
    WebDriverWait(browser, WAIT_S).until(staleness_of(page))


def sign_in(browser: Any, rig: Rig, secret: str) -> None:
    browser.get(f"{rig.url}/login")
    browser.find_element(By.ID, "access_key").send_keys(ADMIN)
    browser.find_element(By.ID, "secret_key").send_keys(secret)
    submit(browser, "sign-in")


def test_a_wrong_password_is_refused_and_the_right_one_signs_in(rig: Rig, browser: Any) -> None:
    browser.get(rig.url)
    assert browser.current_url.endswith("/login")
    shot(browser, "01a-sign-in")
    sign_in(browser, rig, "not-the-secret")
    assert browser.current_url.endswith("/login")
    assert "Sign-in refused" in text(browser, "#login-error")
    shot(browser, "01b-sign-in-refused")
    browser.get(f"{rig.url}/topics")
    assert browser.current_url.endswith("/login"), "a refused sign-in must not open a session"
    sign_in(browser, rig, ADMIN_SECRET)
    assert browser.current_url == f"{rig.url}/"


def test_cluster_topics_and_groups_render(rig: Rig, browser: Any) -> None:
    browser.get(f"{rig.url}/")
    cards = browser.find_elements(By.CSS_SELECTOR, "#brokers .broker")
    assert len(cards) == 2
    assert "broker-a" in cards[0].text and "broker-b" in cards[1].text
    assert all("epoch" in card.text for card in cards)
    shot(browser, "02-cluster")
    browser.get(f"{rig.url}/topics")
    rows = text(browser, "#topics")
    assert rows.count(TOPIC) >= 2 and "%DLQ%fragile" in rows

    def rated() -> bool:  # the console's sampler has two samples of the topic's offsets
        browser.get(f"{rig.url}/topics")
        return any(row.text.split()[1] == TOPIC and not row.text.endswith(" -")
                   for row in browser.find_elements(By.CSS_SELECTOR, "#topics tr")[1:])

    wait_for(rated, "a sampled rate of Orders")
    shot(browser, "03-topics")
    browser.get(f"{rig.url}/topics/{TOPIC}")
    assert len(browser.find_elements(By.CSS_SELECTOR, "table.queues")) == 2
    shot(browser, "04-topic")
    browser.get(f"{rig.url}/groups")
    groups = text(browser, "#groups")
    assert "billing" in groups and "fragile" in groups
    shot(browser, "05-groups")


def test_group_page_shows_lag_history_inflight_and_clients_and_resets(rig: Rig, browser: Any) -> None:
    def chart_drawn() -> bool:
        browser.get(f"{rig.url}/groups/billing")
        return bool(browser.find_elements(By.CSS_SELECTOR, "#lag-chart polyline"))

    wait_for(chart_drawn, "two lag samples")
    assert "pop" in text(browser, "#progress")
    inflight = text(browser, "#inflight")
    assert inflight.count("nothing in flight") < 2, inflight  # billing left 6 of its 20 unacked
    clients = text(browser, "#clients")
    assert clients.count("grpc") >= 1, clients  # its consumer heartbeats the brokers of its route
    shot(browser, "06-group")
    submit(browser, "reset")
    assert "reset on" in text(browser, "#reset-done")


def test_message_lookup_and_trace(rig: Rig, browser: Any) -> None:
    browser.get(f"{rig.url}/messages?by=key&q=order-3&topic={TOPIC}")
    assert browser.find_elements(By.ID, "results"), text(browser, "main")
    results = text(browser, "#results")
    assert "order 3: 2 widgets" in results
    shot(browser, "07-messages")
    message_id = rig.ids[3]
    browser.get(f"{rig.url}/messages?by=id&q={message_id}")
    assert message_id in text(browser, "#results")
    traced = rig.dead_ids[0]
    browser.get(f"{rig.url}/trace?id={traced}")
    steps = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#trace tr.step")]
    kinds = [next(k for k in ("stored", "delivered", "dead lettered") if k in row) for row in steps
             if any(k in row for k in ("stored", "delivered", "dead lettered"))]
    assert kinds[0] == "stored" and "delivered" in kinds and "dead lettered" in kinds, steps
    shot(browser, "08-trace")


def test_dlq_browse_select_and_redrive_moves_messages_back(rig: Rig, browser: Any) -> None:
    browser.get(f"{rig.url}/groups/fragile/dlq")
    boxes = browser.find_elements(By.CSS_SELECTOR, "table.dlq input[type=checkbox]")
    assert len(boxes) == len(rig.dead_ids)
    shot(browser, "09-dlq")
    chosen = boxes[:3]
    picked = {box.get_attribute("value").partition("|")[2] for box in chosen}
    for box in chosen:
        box.click()
    submit(browser, "redrive-selected")
    assert "re-drove" in text(browser, "#redrive-done")
    shot(browser, "10-dlq-redriven")
    again = consumer(rig, "fragile")
    try:
        seen: set[str] = set()

        def back() -> bool:
            seen.update(m.message_id for m in again.receive(16, 30))
            return picked <= seen

        wait_for(back, "the re-driven messages back in the group")
    finally:
        again.shutdown()
    assert picked <= seen


def test_the_session_cookie_is_http_only_and_a_form_without_its_csrf_token_is_refused(rig: Rig, browser: Any) -> None:
    import urllib.error
    import urllib.parse
    import urllib.request

    browser.get(f"{rig.url}/groups")
    cookie = browser.get_cookie("plugmq_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    forged = urllib.request.Request(f"{rig.url}/groups/fragile/dlq/redrive", method="POST",
                                    data=urllib.parse.urlencode({"all": "1"}).encode(),
                                    headers={"Cookie": f"plugmq_console={cookie['value']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=WAIT_S)
    assert refused.value.code == 403
    for broker in rig.brokers:  # a bulk re-drive would have moved the resend cursor past every dead letter
        if _has_dlq(rig, broker):
            assert not any(d["resent"] for d in rig.admin(broker, "dlq-browse", group="fragile")["messages"])
