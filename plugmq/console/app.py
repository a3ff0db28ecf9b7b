"""The console's web application: Starlette routes, Jinja2 pages rendered on the server, no JavaScript.

Every page needs a signed-in session (``/login`` asks for an admin account of the servers' ACL and
checks it with a signed ``broker-status`` call: a wrong secret is refused there). Every change is a
POST form carrying the session's CSRF token. See :mod:`plugmq.console` for the pages.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from plugmq.admin.verbs import parse_time
from plugmq.console import views
from plugmq.console.brokers import Credentials, Fleet
from plugmq.console.history import History
from plugmq.console.sessions import SESSION_COOKIE, Session, Sessions, tokens_match
from plugmq.core.clock import Clock, SystemClock
from plugmq.core.errors import PlugmqError, ValidationError

__all__ = ["Console", "build_app"]

_HERE = Path(__file__).parent
_LOGIN_COOKIE = "plugmq_console_login"
Handler = Callable[[Request, Session], Awaitable[Response]]


class Console:
    """The console's state: the brokers, the sessions, the sampled history."""

    def __init__(self, fleet: Fleet, *, clock: Clock | None = None, sample_s: float = 10.0,
                 secure_cookies: bool = False) -> None:
        self.fleet = fleet
        self.clock = clock or SystemClock()
        self.sessions = Sessions(self.clock)
        self.history = History(fleet, self.clock, self._sampling_account, interval_s=sample_s)
        self.secure_cookies = secure_cookies
        self.templates = Jinja2Templates(directory=str(_HERE / "templates"))
        self.templates.env.globals.update(when=views.when, preview=views.preview)

    def _sampling_account(self) -> Credentials | bool | None:
        session = self.sessions.latest()
        return False if session is None else session.credentials


def build_app(console: Console) -> Starlette:
    """The ASGI application of ``console`` (its sampler starts and stops with the app)."""
    pages = _Pages(console)

    def guarded(handler: Handler, method: str = "GET") -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = console.sessions.get(request.cookies.get(SESSION_COOKIE))
            if session is None:
                return RedirectResponse("/login", status_code=303)
            if method == "POST":
                form = await request.form()
                if not tokens_match(str(form.get("csrf", "")), session.csrf):
                    return Response("the form's CSRF token is missing or stale; reload the page and try again",
                                    status_code=403)
            return await handler(request, session)
        return endpoint

    routes = [
        Route("/login", pages.login_form, methods=["GET"]),
        Route("/login", pages.login, methods=["POST"]),
        Route("/logout", guarded(pages.logout, "POST"), methods=["POST"]),
        Route("/", guarded(pages.cluster)),
        Route("/topics", guarded(pages.topics)),
        Route("/topics/{topic}", guarded(pages.topic)),
        Route("/groups", guarded(pages.groups)),
        Route("/groups/{group}", guarded(pages.group)),
        Route("/groups/{group}/reset", guarded(pages.reset, "POST"), methods=["POST"]),
        Route("/groups/{group}/dlq", guarded(pages.dlq)),
        Route("/groups/{group}/dlq/redrive", guarded(pages.redrive, "POST"), methods=["POST"]),
        Route("/messages", guarded(pages.messages)),
        Route("/trace", guarded(pages.trace)),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        console.history.start()
        try:
            yield
        finally:
            console.history.stop()

    return Starlette(routes=routes, lifespan=lifespan)


class _Pages:
    def __init__(self, console: Console) -> None:
        self.c = console

    def render(self, request: Request, template: str, session: Session | None, status: int = 200,
               **context: Any) -> Response:
        return self.c.templates.TemplateResponse(request, template, {"session": session, **context},
                                                 status_code=status)

    def brokers(self, session: Session) -> tuple[str | None, dict[str, Any] | None, list[views.Broker]]:
        return self.c.fleet.cluster(session.credentials)

    # ------------------------------------------------------------------------------ sign-in
    async def login_form(self, request: Request, error: str | None = None, status: int = 200) -> Response:
        token = secrets.token_urlsafe(32)
        response = self.render(request, "login.html", None, status, login_csrf=token, error=error,
                               servers=self.c.fleet.servers)
        response.set_cookie(_LOGIN_COOKIE, token, httponly=True, samesite="strict", secure=self.c.secure_cookies)
        return response

    async def login(self, request: Request) -> Response:
        form = await request.form()
        if not tokens_match(str(form.get("csrf", "")), request.cookies.get(_LOGIN_COOKIE)):
            return await self.login_form(request, "The sign-in form expired; please sign in again.", 403)
        access_key, secret_key = str(form.get("access_key", "")).strip(), str(form.get("secret_key", ""))
        if not access_key or not secret_key:
            return await self.login_form(request, "Give an access key and its secret key.", 400)
        credentials = Credentials(access_key, secret_key)
        try:
            self.c.fleet.check(credentials)
        except PlugmqError as exc:
            self.c.fleet.forget(credentials)
            return await self.login_form(request, f"Sign-in refused: {exc}", 401)
        session = self.c.sessions.create(credentials)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(SESSION_COOKIE, session.token, httponly=True, samesite="strict",
                            secure=self.c.secure_cookies)
        response.delete_cookie(_LOGIN_COOKIE)
        return response

    async def logout(self, request: Request, session: Session) -> Response:
        self.c.sessions.end(session.token)
        if session.credentials is not None:
            self.c.fleet.forget(session.credentials)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    # ------------------------------------------------------------------------------ pages
    async def cluster(self, request: Request, session: Session) -> Response:
        name, view, brokers = self.brokers(session)
        statuses = self.c.fleet.each(brokers, "broker-status", {}, session.credentials)
        return self.render(request, "cluster.html", session, cluster=name, view=view, statuses=statuses)

    async def topics(self, request: Request, session: Session) -> Response:
        _, _, brokers = self.brokers(session)
        calls = self.c.fleet.each(brokers, "topic-list", {}, session.credentials)
        rows = [(call.broker, topic, self.c.history.rate(call.broker.name, topic["topic"]))
                for call in calls if call.error is None for topic in call.result]
        errors = [call for call in calls if call.error is not None]
        return self.render(request, "topics.html", session, rows=rows, errors=errors)

    async def topic(self, request: Request, session: Session) -> Response:
        topic = request.path_params["topic"]
        _, _, brokers = self.brokers(session)
        calls = self.c.fleet.each(brokers, "topic-status", {"topic": topic}, session.credentials)
        rates = {call.broker.name: self.c.history.rate(call.broker.name, topic) for call in calls}
        return self.render(request, "topic.html", session, topic=topic, calls=calls, rates=rates)

    async def groups(self, request: Request, session: Session) -> Response:
        _, _, brokers = self.brokers(session)
        calls = self.c.fleet.each(brokers, "consumer-progress", {}, session.credentials)
        return self.render(request, "groups.html", session, calls=calls)

    async def group(self, request: Request, session: Session, result: Any = None) -> Response:
        group = request.path_params["group"]
        _, _, brokers = self.brokers(session)
        progress = views.where_group_lives(self.c.fleet, brokers, group, session.credentials)
        living = [call.broker for call in progress if call.error is None]
        inflight = self.c.fleet.each(living, "group-inflight", {"group": group, "limit": 200}, session.credentials)
        clients = self.c.fleet.each(living, "group-clients", {"group": group}, session.credentials)
        topics = sorted({q["topic"] for call in progress if call.error is None for q in call.result["queues"]})
        return self.render(request, "group.html", session, group=group, progress=progress, inflight=inflight,
                           clients=clients, topics=topics, chart=views.lag_chart(self.c.history, group),
                           result=result)

    async def reset(self, request: Request, session: Session) -> Response:
        group = request.path_params["group"]
        form = await request.form()
        topic = str(form.get("topic", ""))
        try:
            timestamp = parse_time(str(form.get("time", "")))
        except ValidationError as exc:
            return await self.group(request, session, result={"error": str(exc)})
        _, _, brokers = self.brokers(session)
        living = [c.broker for c in views.where_group_lives(self.c.fleet, brokers, group, session.credentials)
                  if c.error is None]
        calls = self.c.fleet.each(living, "reset-offset", {"group": group, "topic": topic, "timestamp_ms": timestamp},
                                  session.credentials)
        return await self.group(request, session, result={"reset": calls, "topic": topic})

    async def dlq(self, request: Request, session: Session, result: Any = None) -> Response:
        group = request.path_params["group"]
        _, _, brokers = self.brokers(session)
        offset = request.query_params.get("offset")
        args: dict[str, Any] = {"group": group, "limit": 50}
        if offset is not None and offset.isdigit():
            args["offset"] = int(offset)
        pages = self.c.fleet.each(brokers, "dlq-browse", args, session.credentials)
        pages = [p for p in pages if p.error is None or "has no dead-letter topic" not in p.error]
        return self.render(request, "dlq.html", session, group=group, pages=pages, result=result)

    async def redrive(self, request: Request, session: Session) -> Response:
        group = request.path_params["group"]
        form = await request.form()
        chosen: dict[str, list[str]] = {}
        for value in form.getlist("message"):
            broker_name, _, message_id = str(value).partition("|")
            chosen.setdefault(broker_name, []).append(message_id)
        everything = form.get("all") == "1"
        _, _, brokers = self.brokers(session)
        calls = []
        for broker in brokers:
            if not everything and broker.name not in chosen:
                continue
            args: dict[str, Any] = {"group": group, "ids": [] if everything else chosen[broker.name]}
            calls += self.c.fleet.each([broker], "resend-dlq", args, session.credentials)
        if not calls:
            return await self.dlq(request, session, result={"error": "select the dead letters to re-drive"})
        return await self.dlq(request, session, result={"redrive": calls})

    async def messages(self, request: Request, session: Session) -> Response:
        query = request.query_params
        by = query.get("by", "id")
        value, topic = query.get("q", "").strip(), query.get("topic", "").strip()
        args: dict[str, Any] = {"max": 50}
        calls: list[views.BrokerCall] = []
        error = None
        if value:
            try:
                if by == "key":
                    args.update(key=value, topic=topic)
                elif by == "time":
                    args.update(begin_ms=parse_time(value), topic=topic)
                else:
                    args.update(id=value)
                _, _, brokers = self.brokers(session)
                calls = self.c.fleet.each(brokers, "query-msg", args, session.credentials)
            except ValidationError as exc:
                error = str(exc)
        found = [(call.broker, m) for call in calls if call.error is None for m in call.result]
        errors = [call for call in calls if call.error is not None]
        return self.render(request, "messages.html", session, by=by, q=value, topic=topic, found=found,
                           errors=errors, error=error, searched=bool(value))

    async def trace(self, request: Request, session: Session) -> Response:
        message_id = request.query_params.get("id", "").strip()
        calls: list[views.BrokerCall] = []
        if message_id:
            _, _, brokers = self.brokers(session)
            calls = self.c.fleet.each(brokers, "trace", {"id": message_id}, session.credentials)
        events = views.merged_trace(calls)
        errors = [call for call in calls if call.error is not None]
        return self.render(request, "trace.html", session, message_id=message_id, events=events, errors=errors)
