"""Adapters: the only code that imports a framework. Each translates framework events into hook
calls and applies the plugins' decisions. Frameworks are imported lazily, inside functions, so
importing an adapter never imports its framework."""
