"""The Python types against docs/control.schema.json: every method the
schema names has its params and result types and a Client or Session
method that sends it, and every field of every $def is a key of the
TypedDict of the same name. Fails when the schema and the client drift."""

from __future__ import annotations

import json
import os
import typing
import unittest

import condfs
from condfs import _aio, _client, _types

SCHEMA = os.environ.get("CONDFS_SCHEMA") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs", "control.schema.json"
)


def load_schema() -> dict[str, typing.Any]:
    with open(SCHEMA, encoding="utf-8") as f:
        return typing.cast("dict[str, typing.Any]", json.load(f))


def ref_name(node: dict[str, typing.Any]) -> str:
    ref = node["$ref"]
    assert ref.startswith("#/$defs/"), ref
    return str(ref[len("#/$defs/") :])


class SchemaTest(unittest.TestCase):
    schema: dict[str, typing.Any]

    @classmethod
    def setUpClass(cls) -> None:
        cls.schema = load_schema()

    def test_every_method_has_types_and_a_call(self) -> None:
        for method, entry in self.schema["methods"].items():
            with self.subTest(method=method):
                self.assertIn(method, _types.METHODS, f"method {method} of the schema has no types in condfs._types.METHODS")
                params, result = _types.METHODS[method]
                self.assertEqual(params.__name__, ref_name(entry["params"]), f"{method} params")
                self.assertEqual(result.__name__, ref_name(entry["result"]), f"{method} result")
                self.assertIn(method, _types.CLIENT_METHODS, f"method {method} has no Client or Session method")
                cls_name, attr = _types.CLIENT_METHODS[method].split(".")
                for mod, prefix in ((_client, ""), (_aio, "Async")):
                    owner = getattr(mod, prefix + cls_name)
                    self.assertTrue(callable(getattr(owner, attr, None)), f"{prefix}{cls_name}.{attr} for {method}")
        # The client may know methods of a newer daemon than the schema's;
        # never fewer.
        self.assertLessEqual(set(self.schema["methods"]), set(_types.METHODS))
        for method, entry in self.schema["notifications"].items():
            self.assertEqual(_types.NOTIFICATIONS[method].__name__, ref_name(entry["params"]))

    def test_every_field_is_typed(self) -> None:
        for name, d in self.schema["$defs"].items():
            if "properties" not in d:
                continue
            with self.subTest(type=name):
                t = getattr(_types, name, None)
                self.assertIsNotNone(t, f"$def {name} has no TypedDict in condfs._types")
                keys = set(typing.get_type_hints(t))
                for field in d["properties"]:
                    self.assertIn(field, keys, f"{name}.{field} of the schema is missing from condfs._types.{name}")
                required = set(d.get("required", []))
                self.assertEqual(
                    set(t.__required_keys__) & set(d["properties"]), required, f"{name}: required keys differ from the schema"
                )

    def test_public_names(self) -> None:
        for name in ("Client", "AsyncClient", "Session", "AsyncSession", "CondfsError", "RunResult", "Decision", "Status"):
            self.assertTrue(hasattr(condfs, name), name)


if __name__ == "__main__":
    unittest.main()
