"""HTML for the dashboard: pure functions from facts to markup.

Every value that comes from a service passes through `e()` (text and attribute
escaping) or `url()` (a path segment); nothing else is interpolated."""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote, urlencode

from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel_ui import view
from funnel_ui.view import enum_name


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def url(*segments: str) -> str:
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


def when(stamp: Timestamp) -> str:
    if stamp.seconds == 0 and stamp.nanos == 0:
        return ""
    return stamp.ToDatetime().strftime("%Y-%m-%d %H:%M:%S") + "Z"


def at(unix: float) -> str:
    """A point in time (UTC, the services' clock) and its age, which the browser
    keeps current (ui.js, from `data-at`)."""
    if not unix:
        return ""
    moment = datetime.datetime.fromtimestamp(unix, datetime.UTC)
    full = moment.strftime("%Y-%m-%d %H:%M:%S") + "Z"
    return (
        f'<time datetime="{moment.isoformat()}" title="{full}">{moment.strftime("%m-%d %H:%M:%S")}</time>'
        f' <span class=age data-at="{unix:.3f}"></span>'
    )


def span(seconds: float) -> str:
    """A duration for people: 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    whole = max(0, int(seconds))
    for unit, size, smaller, small_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if whole >= size:
            rest = (whole % size) // small_size
            return f"{whole // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{whole} s"


def page(title: str, body: str, stream: str = "") -> str:
    attribute = f' data-stream="{e(stream)}"' if stream else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{e(title)} · funnel</title><link rel=stylesheet href=/static/ui.css>"
        "<script src=/static/ui.js defer></script></head>"
        f'<body><header><a href="/">funnel</a> <span id=live></span><span id=notice></span></header>'
        f"<main{attribute}>{body}</main></body></html>"
    )


def badge(value: view.Badge) -> str:
    title = f' title="{e(value.detail)}"' if value.detail else ""
    return f'<span class="badge {e(value.kind)}"{title}>{e(value.label)}</span>'


def index(workspaces: Sequence[str]) -> str:
    links = "".join(f'<li><a href="{url("w", w)}">{e(w)}</a></li>' for w in workspaces)
    return page(
        "workspaces",
        f"<h1>Workspaces</h1><ul>{links}</ul>"
        "<form method=get action=/go><input name=workspace placeholder=workspace required> "
        "<button>Open</button></form>",
    )


STATES = ("REGISTERED", "ACTIVE", "SUSPENDED", "TERMINAL")
OUTCOMES = ("COMPLETED", "CANCELLED", "FAILED", "TIMED_OUT")
WORK = ("READY", "IN_PROGRESS", "BLOCKED", "DONE", "CANCELLED")


def _select(name: str, values: Iterable[str], chosen: str) -> str:
    options = "".join(
        f'<option value="{e(v)}"{" selected" if v == chosen else ""}>{e(v.lower())}</option>' for v in values
    )
    return f'<select name={name}><option value="">{name.replace("_", " ")}: any</option>{options}</select>'


def task_row(workspace: str, lifecycle: view.Lifecycle, settlements: Mapping[str, view.Settlement]) -> str:
    return (
        f'<tr id="row-{e(lifecycle.task_id)}" data-revision="{lifecycle.revision}">'
        f'<td><a href="{url("w", workspace, "t", lifecycle.task_id)}">{e(lifecycle.task_id)}</a></td>'
        f"<td>{badge(view.task_badge(lifecycle, settlements))}</td>"
        f"<td class=num>{lifecycle.generation}</td><td class=num>{lifecycle.revision}</td>"
        f"<td>{e(lifecycle.state.lower())}</td><td>{e(lifecycle.outcome.lower())}</td>"
        f"<td>{e(lifecycle.work_status.lower())}</td>"
        f"<td class=created>{at(lifecycle.created)}</td><td class=changed>{at(lifecycle.changed)}</td></tr>"
    )


def shown(count: int) -> str:
    return f"<span id=shown>{count} shown</span>"


def counts(workspace: str, counted: lifecycle_messages.CountTasksResponse) -> str:
    """How many tasks the workspace has in each lifecycle state (terminal ones by
    outcome) and each work status, each a link to the list so filtered."""
    by_state: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    by_work: dict[str, int] = {}
    for count in counted.counts:
        state = enum_name(lifecycle_enums.GenerationState, count.state, "GENERATION_STATE_")
        by_state[state] = by_state.get(state, 0) + count.tasks
        if count.outcome:
            outcome = enum_name(lifecycle_enums.TerminalOutcome, count.outcome, "TERMINAL_OUTCOME_")
            by_outcome[outcome] = by_outcome.get(outcome, 0) + count.tasks
        work = enum_name(lifecycle_enums.WorkStatus, count.work_status, "WORK_STATUS_")
        by_work[work] = by_work.get(work, 0) + count.tasks

    def links(name: str, values: Sequence[str], found: Mapping[str, int]) -> str:
        return " ".join(
            f'<a class=count data-{name.replace("_", "-")}="{e(v)}" href="{url("w", workspace)}?'
            f'{e(urlencode({name: v}))}">{e(v.lower().replace("_", " "))} <b>{found.get(v, 0)}</b></a>'
            for v in values
        )

    return (
        f"<section id=counts><p><span class=total>{counted.total} tasks</span> · state: "
        f"{links('state', STATES, by_state)} · outcome: {links('outcome', OUTCOMES, by_outcome)}</p>"
        f"<p>work status: {links('work_status', WORK, by_work)}</p></section>"
    )


def task_list(
    workspace: str,
    filter_: view.Filter,
    tasks: Sequence[view.Lifecycle],
    settlements: Mapping[str, Mapping[str, view.Settlement]],
    next_token: str,
    stream_cursor: view.Cursor,
    counted: lifecycle_messages.CountTasksResponse,
    first_page: bool = True,
) -> str:
    query = filter_.query
    rows = "".join(task_row(workspace, t, settlements.get(t.task_id, {})) for t in tasks)
    paging = f'<a href="{url("w", workspace)}?{e(urlencode(query))}">first page</a>'
    if next_token:
        following = urlencode({**query, "page": next_token})
        paging += f' · <a id=next href="{url("w", workspace)}?{e(following)}">next page</a>'
    orders = {"id": "by task id", "changed": "last change first"}
    sort = "".join(
        f'<option value="{v}"{" selected" if v == filter_.order else ""}>{label}</option>'
        for v, label in orders.items()
    )
    form = (
        f'<form class=filters method=get action="{url("w", workspace)}">'
        f"{_select('state', STATES, filter_.state)} {_select('outcome', OUTCOMES, filter_.outcome)} "
        f"{_select('work_status', WORK, filter_.work_status)} "
        f'<input name=q value="{e(filter_.prefix)}" placeholder="task id starts with"> '
        f"<select name=sort>{sort}</select> <button>Filter</button></form>"
    )
    # The range this page stands for: a task that comes to belong in it is inserted live.
    bounds = {
        "first": "" if first_page or not tasks else tasks[0].task_id,
        "last": tasks[-1].task_id if next_token and tasks else "",
        **({} if first_page else {"page": "later"}),
    }
    stream = f"{url('w', workspace, 'stream')}?" + urlencode(
        {"after": stream_cursor.event_id(), "tasks": ",".join(t.task_id for t in tasks), **query, **bounds}
    )
    body = (
        f'<h1>Tasks of {e(workspace)} <a class=attention href="{url("w", workspace, "attention")}">'
        f"what needs attention</a></h1>{counts(workspace, counted)}{form}"
        "<table class=tasks><thead><tr><th>task</th><th>status</th><th>gen</th><th>rev</th><th>state</th>"
        "<th>outcome</th><th>work status</th><th>created</th><th>last change</th></tr></thead>"
        f"<tbody id=tasks>{rows}</tbody></table>"
        f"<p class=paging>{shown(len(tasks))} · {paging}</p>"
    )
    return page(f"tasks of {workspace}", body, stream)


# -- the task page -------------------------------------------------------


def task_head(
    workspace: str,
    lifecycle: view.Lifecycle,
    settlements: Mapping[str, view.Settlement],
    actions: Sequence[view.Action],
    csrf: str,
    request_id: str,
) -> str:
    forms = "".join(
        f'<form method=post action="{url("w", workspace, "t", lifecycle.task_id, action.name)}">'
        f'<input type=hidden name=csrf value="{e(csrf)}">'
        f'<input type=hidden name=generation value="{lifecycle.generation}">'
        f'<input type=hidden name=revision value="{lifecycle.revision}">'
        f'<input type=hidden name=request_id value="{e(request_id)}-{e(action.name)}">'
        f'<button class="{"primary" if action.primary else "secondary"}" data-action="{e(action.name)}">'
        f"{e(action.label)}</button></form>"
        for action in actions
    )
    current = view.task_badge(lifecycle, settlements)
    return (
        f'<section id=task-head data-revision="{lifecycle.revision}">'
        f"<h1>{e(lifecycle.task_id)} {badge(current)}</h1>"
        f"<p class=detail id=badge-detail>{e(current.detail)}</p>"
        "<dl>"
        f"<dt>generation</dt><dd id=generation>{lifecycle.generation}</dd>"
        f"<dt>revision</dt><dd>{lifecycle.revision}</dd>"
        f"<dt>lifecycle state</dt><dd id=state>{e(lifecycle.state.lower())}</dd>"
        f"<dt>terminal outcome</dt><dd>{e(lifecycle.outcome.lower() or '—')}</dd>"
        f"<dt>work status</dt><dd>{e(lifecycle.work_status.lower())}</dd>"
        f"<dt>cancellation</dt><dd>{'requested' if lifecycle.cancellation_requested else 'none'}</dd>"
        f"<dt>settled completion</dt><dd>{e(lifecycle.completion_id or '—')}</dd>"
        f"</dl><div class=actions>{forms}</div></section>"
    )


def _cause(cause: lifecycle_types.Cause) -> str:
    ids = ", ".join(f"{k}={v}" for k, v in sorted(cause.originating_ids.items()))
    return e(" · ".join(part for part in (cause.source, cause.reason, ids) if part))


def lifecycle_row(event: lifecycle_types.LifecycleEvent) -> str:
    to_state = enum_name(lifecycle_enums.GenerationState, event.to_state, "GENERATION_STATE_")
    outcome = (
        "" if not event.outcome else enum_name(lifecycle_enums.TerminalOutcome, event.outcome, "TERMINAL_OUTCOME_")
    )
    from_state = enum_name(lifecycle_enums.GenerationState, event.from_state, "GENERATION_STATE_")
    transition = f"{from_state.lower()} → {to_state.lower()}"
    return (
        f'<tr id="ev-{event.sequence}" data-state="{e(to_state)}" data-outcome="{e(outcome)}">'
        f"<td class=num>#{event.sequence}</td><td class=num>{event.revision}</td><td class=num>{event.generation}</td>"
        f"<td>{e(enum_name(lifecycle_enums.Intent, event.intent, 'INTENT_').lower())}</td><td>{e(transition)}</td>"
        f"<td>{e(outcome.lower())}</td>"
        f"<td>{e(enum_name(lifecycle_enums.WorkStatus, event.work_status, 'WORK_STATUS_').lower())}</td>"
        f"<td class=id>{_cause(event.cause)}</td><td class=id>{_who(event.caller)}</td>"
        f"<td>{e(when(event.commit_time))}</td></tr>"
    )


def _trace(decision: completion_types.Decision) -> str:
    rows = "".join(
        f"<tr><td>{e(g.gate_id)}</td><td class=num>{g.gate_version}</td>"
        f"<td>{e(enum_name(completion_enums.GateStatus, g.status, 'GATE_STATUS_').lower())}</td>"
        f"<td>{'decisive' if g.decisive else ''}</td><td>{e(g.reason)}</td></tr>"
        for g in decision.trace
    )
    details = MessageToDict(decision.details) if decision.HasField("details") else {}
    extra = f"<pre>{e(json.dumps(details, indent=1, sort_keys=True))}</pre>" if details else ""
    return (
        f"<details><summary>gate trace ({len(decision.trace)} gates)</summary>"
        f"<table><tr><th>gate</th><th>v</th><th>status</th><th></th><th>reason</th></tr>{rows}</table>"
        f"{extra}</details>"
    )


def completion_event_row(event: completion_types.CompletionEvent) -> str:
    kind = enum_name(completion_enums.CompletionEventKind, event.kind, "COMPLETION_EVENT_KIND_")
    if event.HasField("decision"):
        decision = event.decision
        what = (
            f"{e(enum_name(completion_enums.Verdict, decision.verdict, 'VERDICT_'))} · next action "
            f"{e(enum_name(completion_enums.AgentAction, decision.next_action, 'AGENT_ACTION_'))}"
            f"<div class=instruction>{e(decision.instruction)}</div>{_trace(decision)}"
        )
    elif event.kind == completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED:
        what = f"settled at lifecycle revision {event.lifecycle_revision} (event #{event.lifecycle_event_sequence})"
    elif event.kind == completion_enums.COMPLETION_EVENT_KIND_TERMINALIZATION_ERROR:
        what = f"terminalization error {e(event.error_reason)}: {e(event.error_message)}"
    elif event.kind == completion_enums.COMPLETION_EVENT_KIND_RUN_CLOSED:
        what = f"closed {e(enum_name(completion_enums.RunOutcome, event.run_outcome, 'RUN_OUTCOME_').lower())}"
    elif event.kind == completion_enums.COMPLETION_EVENT_KIND_EVIDENCE_RECORDED:
        what = f"evidence <span class=id>{e(event.evidence_id)}</span>"
    else:
        what = ""  # RUN_CLAIMED, and kinds this dashboard does not know yet (shown by name or number)
    return (
        f'<tr id="ce-{event.sequence}" data-kind="{e(kind)}"><td class=num>#{event.sequence}</td>'
        f"<td class=num>{event.generation}</td><td>{e(kind.lower().replace('_', ' '))}</td><td>{what}</td>"
        f"<td class=id>{e(event.completion_id)}</td><td class=id>{e(event.run_id)}</td>"
        f"<td>{e(when(event.commit_time))}</td></tr>"
    )


def completions_section(
    completions: Sequence[completion_types.Completion], settlements: Mapping[str, view.Settlement]
) -> str:
    rows = "".join(
        f'<tr data-completion="{e(c.completion_id)}"><td class=id>{e(c.completion_id)}</td>'
        f"<td class=num>{c.generation}</td>"
        f"<td>{e(enum_name(completion_enums.RequestedOutcome, c.outcome, 'REQUESTED_OUTCOME_').lower())}</td>"
        f"<td class=settlement>{e(view.settlement_label(_settlement(c, settlements)))}</td>"
        f"<td class=id>{e(c.run_id)}</td><td>{at(view.seconds(c.commit_time))}</td>"
        f"<td class=settling>{_settling(c)}</td><td>{e(c.result)}</td></tr>"
        for c in completions
    )
    return (
        "<section id=completions><h2>Completions and their settlement</h2>"
        "<table><tr><th>completion</th><th>gen</th><th>outcome</th><th>settlement</th><th>run</th>"
        f"<th>committed</th><th>with the lifecycle service</th><th>result</th></tr>{rows}</table></section>"
    )


def _settling(completion: completion_types.Completion) -> str:
    """How the settlement went, as read: while pending, the unanswered calls and the
    next one (what `funnel outbox` shows); once answered, when and how long after."""
    committed = view.seconds(completion.commit_time)
    if completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING:
        error = f"; last: {e(completion.last_settle_error)}" if completion.last_settle_error else ""
        return (
            f"pending: {completion.settle_attempts} call(s) unanswered, next "
            f"{at(view.seconds(completion.next_settle_time))}{error}"
        )
    answered = view.seconds(completion.settle_time)
    return f"answered {span(answered - committed)} after the commit" if answered else ""


def _settlement(completion: completion_types.Completion, known: Mapping[str, view.Settlement]) -> view.Settlement:
    """The further along of the read and the events seen since."""
    read = view.settlement_from_completion(completion)
    seen = known.get(completion.completion_id)
    return read if seen is None or view.rank(read) >= view.rank(seen) else seen


def _lease(run: completion_types.Run, now: float) -> str:
    state = view.lease_state(run, now)
    expiry = view.seconds(run.lease_expire_time)
    if state == "closed":
        return "—"
    if state == "live":
        return f"live, expires {at(expiry)}"
    return f"<span class=warn>expired, not swept</span> {at(expiry)}"


def run_row(run: completion_types.Run, now: float) -> str:
    outcome = "" if not run.outcome else enum_name(completion_enums.RunOutcome, run.outcome, "RUN_OUTCOME_").lower()
    final = (
        enum_name(completion_enums.FinalStatus, run.final_status, "FINAL_STATUS_").lower() if run.final_status else ""
    )
    claimed = view.seconds(run.claim_time)
    ended = view.seconds(run.finish_time) if run.HasField("finish_time") else now
    return (
        f'<tr id="run-{e(run.run_id)}" data-lease="{e(view.lease_state(run, now))}" '
        f'data-lease-expires="{view.seconds(run.lease_expire_time):.3f}" data-outcome="{e(outcome)}">'
        f"<td class=id>{e(run.run_id)}</td><td>{e(run.agent_id)}</td><td class=num>{run.generation}</td>"
        f"<td class=num>{run.epoch}</td><td>{at(claimed)}</td><td class=lease>{_lease(run, now)}</td>"
        f"<td>{at(view.seconds(run.finish_time))}</td>"
        f"<td class=num>{span(ended - claimed)}{'' if run.HasField('finish_time') else ' so far'}</td>"
        f"<td>{e(outcome)}</td><td>{e(final)}</td><td class=num>{run.tokens_total}</td>"
        f"<td>{e(run.notes)}{' (truncated)' if run.notes_truncated else ''}</td><td>{e(run.error)}</td></tr>"
    )


def runs_section(runs: Sequence[completion_types.Run], now: float) -> str:
    rows = "".join(run_row(r, now) for r in runs)
    return (
        "<section id=runs><h2>Runs</h2><table><tr><th>run</th><th>agent</th><th>gen</th><th>lease epoch</th>"
        "<th>claimed</th><th>lease</th><th>closed</th><th>duration</th><th>outcome</th><th>final status</th>"
        f"<th>tokens</th><th>notes</th><th>error</th></tr>{rows}</table></section>"
    )


def evidence_section(evidence: Sequence[completion_types.Evidence]) -> str:
    rows = "".join(
        f'<tr data-evidence="{e(fact.evidence_id)}"><td>{e(fact.kind)}</td>'
        f"<td>{badge(_verdict(fact.verdict))}</td><td class=num>{fact.generation}</td>"
        f"<td class=id>{e(fact.checkpoint or '—')}</td><td>{e(fact.details)}</td><td class=id>{e(fact.run_id)}</td>"
        f"<td class=id>{_who(fact.recorded_by)}</td><td>{at(view.seconds(fact.record_time))}</td></tr>"
        for fact in evidence
    )
    return (
        "<section id=evidence><h2>Evidence</h2><p class=note>For each kind the latest fact at the checkpoint "
        "the completion is judged at counts.</p><table><tr><th>kind</th><th>status</th><th>gen</th>"
        "<th>checkpoint</th><th>details</th><th>run</th><th>recorded by</th><th>recorded</th></tr>"
        f"{rows}</table></section>"
    )


def _verdict(verdict: int) -> view.Badge:
    word = enum_name(completion_enums.EvidenceVerdict, verdict, "EVIDENCE_VERDICT_").lower()
    return view.Badge(word, "completed" if word == "passed" else "failed")


def _who(caller: completion_types.Caller | lifecycle_types.Caller) -> str:
    return f"{e(caller.subject)} ({e(caller.role)})" if caller.subject else "—"


def transcript_row(event: completion_types.SessionEvent) -> str:
    kind = event.WhichOneof("body") or "unknown"
    body = MessageToDict(getattr(event, kind)) if kind != "unknown" else {}
    summary = " · ".join(f"{k}: {v}" for k, v in body.items())
    marker = (
        (
            '<span class="badge synthetic" title="written by the service when it loaded a transcript whose '
            'final turn was interrupted">synthetic closer: interrupted turn</span> '
        )
        if event.synthetic
        else ""
    )
    return (
        f'<tr class="{"synthetic" if event.synthetic else ""}"><td class=num>{event.sequence}</td>'
        f"<td class=num>{event.generation}</td><td>{e(kind.replace('_', ' '))}</td><td>{marker}{e(summary)}</td>"
        f"<td>{e(when(event.record_time))}</td></tr>"
    )


def task_page(
    workspace: str,
    lifecycle: view.Lifecycle,
    head: str,
    events: Sequence[lifecycle_types.LifecycleEvent],
    completion_events: Sequence[completion_types.CompletionEvent],
    completions: str,
    runs: str,
    evidence: str,
    transcript: Sequence[completion_types.SessionEvent],
    transcript_more: bool,
    cursor: view.Cursor,
) -> str:
    timeline = "".join(lifecycle_row(event) for event in events)
    attempts = "".join(completion_event_row(event) for event in completion_events)
    lines = "".join(transcript_row(event) for event in transcript)
    more = "<p>Only the first events are shown; `funnel transcript export` has them all.</p>" if transcript_more else ""
    body = (
        f'<p><a href="{url("w", workspace)}">← tasks of {e(workspace)}</a></p>{head}'
        "<section><h2>Lifecycle timeline</h2><p class=note>The task's terminality comes from these events only.</p>"
        "<table><thead><tr><th>seq</th><th>rev</th><th>gen</th><th>intent</th><th>transition</th><th>outcome</th>"
        "<th>work status</th><th>cause</th><th>caller</th><th>committed</th></tr></thead>"
        f"<tbody id=timeline>{timeline}</tbody></table></section>"
        "<section><h2>Completion events</h2><p class=note>Claims, closes, evidence, attempts and settlements, "
        "as the completion service committed them.</p><table><thead><tr><th>seq</th><th>gen</th><th>kind</th>"
        "<th>what</th><th>completion</th><th>run</th><th>committed</th></tr></thead>"
        f"<tbody id=attempts>{attempts}</tbody></table></section>{completions}{runs}{evidence}"
        "<section id=transcript><h2>Transcript</h2><table><tr><th>seq</th><th>gen</th><th>event</th><th></th>"
        f"<th>recorded</th></tr>{lines}</table>{more}</section>"
    )
    stream = f"{url('w', workspace, 't', lifecycle.task_id, 'stream')}?" + urlencode({"after": cursor.event_id()})
    return page(lifecycle.task_id, body, stream)


def error_page(title: str, message: str, back: str = "/") -> str:
    return page(title, f'<h1>{e(title)}</h1><p class=error>{e(message)}</p><p><a href="{e(back)}">back</a></p>')


def refusal_page(label: str, code: str, reason: str, details: str, back: str) -> str:
    """An action the lifecycle service did not do: its reason (ErrorInfo) first,
    as the catalogue names it, then its gRPC code and message (a service that
    was not reached names no reason: the code then says why)."""
    return page(
        f"{label}: not done",
        (
            f"<h1>{e(label)}: not done</h1>"
            f'<p class=error id=refusal data-reason="{e(reason)}">The lifecycle service answered '
            f"<b>{e(reason or code)}</b> ({e(code)})</p><p class=detail>{e(details)}</p>"
            f'<p><a href="{e(back)}">back to the task</a></p>'
        ),
    )


# -- what needs attention ----------------------------------------------------------------


def _task_link(workspace: str, task_id: str) -> str:
    return f'<a href="{url("w", workspace, "t", task_id)}">{e(task_id)}</a>'


def _table(name: str, title: str, note: str, head: Sequence[str], rows: Sequence[str]) -> str:
    cells = "".join(f"<th>{e(h)}</th>" for h in head)
    body = "".join(rows) or f"<tr class=none><td colspan={len(head)}>nothing</td></tr>"
    return (
        f'<section id="attention-{name}"><h2>{e(title)} <span class=count>{len(rows)}</span></h2>'
        f"<p class=note>{note}</p><table><tr>{cells}</tr>{body}</table></section>"
    )


def attention(workspace: str, facts: view.Attention, long_run_seconds: float, now: float) -> str:
    pending = [
        f'<tr data-task="{e(c.task_id)}"><td>{_task_link(workspace, c.task_id)}</td><td class=num>{c.generation}</td>'
        f"<td class=id>{e(c.completion_id)}</td><td>{at(view.seconds(c.commit_time))}</td>"
        f"<td class=num>{span(now - view.seconds(c.commit_time))}</td><td>{_settling(c)}</td></tr>"
        for c in facts.pending
    ]

    def run_rows(runs: Sequence[completion_types.Run]) -> list[str]:
        return [
            f'<tr data-task="{e(r.task_id)}"><td>{_task_link(workspace, r.task_id)}</td><td class=id>{e(r.run_id)}</td>'
            f"<td>{e(r.agent_id)}</td><td>{at(view.seconds(r.claim_time))}</td>"
            f"<td class=num>{span(now - view.seconds(r.claim_time))}</td><td class=lease>{_lease(r, now)}</td></tr>"
            for r in runs
        ]

    rejected = [
        f'<tr data-task="{e(c.task_id)}"><td>{_task_link(workspace, c.task_id)}</td><td class=num>{c.generation}</td>'
        f"<td class=id>{e(c.completion_id)}</td><td>{e(c.terminalization_error_reason)}: "
        f"{e(c.terminalization_error_message)}</td><td>{at(view.seconds(c.settle_time))}</td></tr>"
        for c in facts.rejected
    ]
    run_head = ("task", "run", "agent", "claimed", "open for", "lease")
    return (
        f"<div id=attention><p class=summary><b>{facts.count}</b> need attention</p>"
        + _table(
            "pending",
            "Settlements pending",
            "Committed completions the lifecycle service has not confirmed "
            "yet, oldest first (what <code>funnel outbox</code> shows): the task is not done until one settles.",
            ("task", "gen", "completion", "committed", "waiting", "with the lifecycle service"),
            pending,
        )
        + _table(
            "expired",
            "Leases lapsed, runs not closed",
            "The run's lease expired and nothing closed the run "
            "(the stall sweeper has not, or is not enabled): its agent is gone or stuck.",
            run_head,
            run_rows(facts.expired),
        )
        + _table(
            "long",
            "Runs open long",
            f"Open for more than {e(span(long_run_seconds))} with a live lease "
            "(<code>funnel ui --long-run-minutes</code>).",
            run_head,
            run_rows(facts.long_open),
        )
        + _table(
            "rejected",
            "Completions rejected",
            "The latest completion of the task's current generation was "
            "refused by the lifecycle service and the task is still open"
            + (f" ({e(facts.rejected_unknown)})" if facts.rejected_unknown else "")
            + ".",
            ("task", "gen", "completion", "refusal", "answered"),
            rejected,
        )
        + "</div>"
    )


def attention_page(
    workspace: str, facts: view.Attention, long_run_seconds: float, now: float, cursor: view.Cursor
) -> str:
    body = (
        f'<p><a href="{url("w", workspace)}">← tasks of {e(workspace)}</a></p>'
        f"<h1>What needs attention in {e(workspace)}</h1>{attention(workspace, facts, long_run_seconds, now)}"
    )
    stream = f"{url('w', workspace, 'attention', 'stream')}?" + urlencode({"after": cursor.event_id()})
    return page(f"attention in {workspace}", body, stream)
