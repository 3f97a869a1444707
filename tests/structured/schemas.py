"""Real-looking JSON schemas (nested objects, arrays, enums) and the chat prompts that ask for them,
shared by the structured-output end-to-end tests. Strings and arrays are bounded so that a 135M
model always closes its JSON well within the token budget."""

from __future__ import annotations

from typing import Any

_NAME = {"type": "string", "minLength": 1, "maxLength": 24}

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": _NAME,
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "is_student": {"type": "boolean"},
    },
    "required": ["name", "age", "is_student"],
}

ADDRESS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": _NAME,
        "country": _NAME,
        "location": {
            "type": "object",
            "properties": {
                "lat": {"type": "number"},
                "lon": {"type": "number"},
            },
            "required": ["lat", "lon"],
        },
    },
    "required": ["city", "country", "location"],
}

ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"product": _NAME, "quantity": {"type": "integer", "minimum": 1}},
                "required": ["product", "quantity"],
            },
        },
    },
    "required": ["order_id", "status", "items"],
}

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": _NAME,
        "temperature": {"type": "number"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "conditions": {
            "type": "array",
            "maxItems": 3,
            "items": {"enum": ["sunny", "cloudy", "rain", "snow", "wind"]},
        },
    },
    "required": ["city", "temperature", "unit", "conditions"],
}

TASK: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 40},
        "priority": {"enum": [1, 2, 3]},
        "done": {"type": "boolean"},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 12}},
    },
    "required": ["title", "priority", "done", "tags"],
}

_SUBJECTS: dict[str, list[str]] = {
    "person": ["Alice, a 30 year old engineer", "Bob, a 19 year old student", "a retired teacher",
               "a young chess player", "Marie Curie", "a firefighter in Lyon", "a baker",
               "a 7 year old boy", "a nurse who studies at night", "a famous painter"],
    "address": ["Paris", "Tokyo", "the capital of Canada", "Sydney", "a small town in Norway",
                "New York", "Cairo", "Buenos Aires", "Berlin", "Nairobi"],
    "order": ["two books and a lamp", "a shipped laptop", "three apples", "a cancelled phone",
              "pens and paper", "a delivered bicycle", "coffee beans", "one guitar",
              "shoes and socks", "a pending table"],
    "weather": ["London today", "Dubai in summer", "Moscow in winter", "Seattle", "Rio",
                "Chicago on a windy day", "Mumbai in the monsoon", "Oslo", "Lima", "Madrid"],
    "task": ["buy milk", "finish the report", "call the dentist", "fix the bike",
             "plan a birthday party", "water the plants", "learn Python", "clean the garage",
             "book flights", "write a poem"],
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": PERSON, "address": ADDRESS, "order": ORDER, "weather": WEATHER, "task": TASK,
}


def requests_50() -> list[tuple[str, dict[str, Any], list[dict[str, str]]]]:
    """50 (schema name, schema, chat messages): 5 schemas x 10 subjects."""
    out = []
    for kind, subjects in _SUBJECTS.items():
        for subject in subjects:
            messages = [
                {"role": "system", "content": "You answer with a single JSON object."},
                {"role": "user", "content": f"Give me a {kind} record for {subject}."},
            ]
            out.append((kind, SCHEMAS[kind], messages))
    return out
