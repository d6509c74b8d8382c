"""Test harness (on `PYTHONPATH` for a CrewAI runner's process): CrewAI's event bus runs the handlers of a finished
tool run a second late, as its thread pool does on a busy machine, after the agent's next model call has left."""

import time

try:
    from crewai.events.event_bus import CrewAIEventsBus
    from crewai.events.types.tool_usage_events import ToolUsageFinishedEvent
except ImportError:  # a process of another environment that inherited the variable
    pass
else:
    LATE_S = 1.0
    call_handlers = CrewAIEventsBus._call_handlers

    def late_call_handlers(self, source, event, *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(event, ToolUsageFinishedEvent):
            time.sleep(LATE_S)
        return call_handlers(self, source, event, *args, **kwargs)

    CrewAIEventsBus._call_handlers = late_call_handlers
