"""The configuration and case data model: server configurations, the backend's guard, engine profiles, assumption facts, case files."""
