from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class GenerationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GENERATION_STATE_UNSPECIFIED: _ClassVar[GenerationState]
    GENERATION_STATE_REGISTERED: _ClassVar[GenerationState]
    GENERATION_STATE_ACTIVE: _ClassVar[GenerationState]
    GENERATION_STATE_SUSPENDED: _ClassVar[GenerationState]
    GENERATION_STATE_TERMINAL: _ClassVar[GenerationState]

class TerminalOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TERMINAL_OUTCOME_UNSPECIFIED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_COMPLETED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_CANCELLED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_FAILED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_TIMED_OUT: _ClassVar[TerminalOutcome]

class CancellationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCELLATION_STATE_UNSPECIFIED: _ClassVar[CancellationState]
    CANCELLATION_STATE_NONE: _ClassVar[CancellationState]
    CANCELLATION_STATE_REQUESTED: _ClassVar[CancellationState]

class WorkStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORK_STATUS_UNSPECIFIED: _ClassVar[WorkStatus]
    WORK_STATUS_READY: _ClassVar[WorkStatus]
    WORK_STATUS_IN_PROGRESS: _ClassVar[WorkStatus]
    WORK_STATUS_BLOCKED: _ClassVar[WorkStatus]
    WORK_STATUS_DONE: _ClassVar[WorkStatus]
    WORK_STATUS_CANCELLED: _ClassVar[WorkStatus]

class TaskOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_ORDER_UNSPECIFIED: _ClassVar[TaskOrder]
    TASK_ORDER_TASK_ID: _ClassVar[TaskOrder]
    TASK_ORDER_LAST_CHANGE: _ClassVar[TaskOrder]

class ParentLinkMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARENT_LINK_MODE_UNSPECIFIED: _ClassVar[ParentLinkMode]
    PARENT_LINK_MODE_ATTACHED: _ClassVar[ParentLinkMode]
    PARENT_LINK_MODE_DETACHED: _ClassVar[ParentLinkMode]

class Intent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTENT_UNSPECIFIED: _ClassVar[Intent]
    INTENT_REGISTER_TASK: _ClassVar[Intent]
    INTENT_ACTIVATE_GENERATION: _ClassVar[Intent]
    INTENT_SUSPEND_GENERATION: _ClassVar[Intent]
    INTENT_RESUME_WITH_GENERATION: _ClassVar[Intent]
    INTENT_REQUEST_CANCELLATION: _ClassVar[Intent]
    INTENT_SETTLE_CANCELLATION: _ClassVar[Intent]
    INTENT_SETTLE_COMPLETION: _ClassVar[Intent]
    INTENT_SETTLE_FAILURE: _ClassVar[Intent]
    INTENT_SETTLE_TIMEOUT: _ClassVar[Intent]
    INTENT_PROPAGATE_PARENT_TERMINATION: _ClassVar[Intent]
    INTENT_SET_WORK_STATUS: _ClassVar[Intent]
GENERATION_STATE_UNSPECIFIED: GenerationState
GENERATION_STATE_REGISTERED: GenerationState
GENERATION_STATE_ACTIVE: GenerationState
GENERATION_STATE_SUSPENDED: GenerationState
GENERATION_STATE_TERMINAL: GenerationState
TERMINAL_OUTCOME_UNSPECIFIED: TerminalOutcome
TERMINAL_OUTCOME_COMPLETED: TerminalOutcome
TERMINAL_OUTCOME_CANCELLED: TerminalOutcome
TERMINAL_OUTCOME_FAILED: TerminalOutcome
TERMINAL_OUTCOME_TIMED_OUT: TerminalOutcome
CANCELLATION_STATE_UNSPECIFIED: CancellationState
CANCELLATION_STATE_NONE: CancellationState
CANCELLATION_STATE_REQUESTED: CancellationState
WORK_STATUS_UNSPECIFIED: WorkStatus
WORK_STATUS_READY: WorkStatus
WORK_STATUS_IN_PROGRESS: WorkStatus
WORK_STATUS_BLOCKED: WorkStatus
WORK_STATUS_DONE: WorkStatus
WORK_STATUS_CANCELLED: WorkStatus
TASK_ORDER_UNSPECIFIED: TaskOrder
TASK_ORDER_TASK_ID: TaskOrder
TASK_ORDER_LAST_CHANGE: TaskOrder
PARENT_LINK_MODE_UNSPECIFIED: ParentLinkMode
PARENT_LINK_MODE_ATTACHED: ParentLinkMode
PARENT_LINK_MODE_DETACHED: ParentLinkMode
INTENT_UNSPECIFIED: Intent
INTENT_REGISTER_TASK: Intent
INTENT_ACTIVATE_GENERATION: Intent
INTENT_SUSPEND_GENERATION: Intent
INTENT_RESUME_WITH_GENERATION: Intent
INTENT_REQUEST_CANCELLATION: Intent
INTENT_SETTLE_CANCELLATION: Intent
INTENT_SETTLE_COMPLETION: Intent
INTENT_SETTLE_FAILURE: Intent
INTENT_SETTLE_TIMEOUT: Intent
INTENT_PROPAGATE_PARENT_TERMINATION: Intent
INTENT_SET_WORK_STATUS: Intent
