"""Structured outputs as vLLM's example writes them: ``StructuredOutputsParams`` with a choice, a regex, a JSON
schema and an EBNF grammar.

    python examples/offline_inference/structured_outputs.py
"""

import json

from tandem import LLM, SamplingParams
from tandem.sampling_params import StructuredOutputsParams

CAR = {"type": "object", "properties": {"brand": {"type": "string"}, "model": {"type": "string"},
                                        "car_type": {"enum": ["sedan", "SUV", "truck"]}},
       "required": ["brand", "model", "car_type"]}
SQL = """
root ::= "SELECT " column " FROM " table " WHERE " column " = " number
column ::= "col_" [0-9]
table ::= "table_" [0-9]
number ::= [0-9]+
"""


def main() -> None:
    llm = LLM(model="smollm2-135m-instruct", max_model_len=512)
    cases = {
        "choice": ("Is this review positive or negative? 'I loved it.'",
                   StructuredOutputsParams(choice=["Positive", "Negative"])),
        "regex": ("An email address for Alan Turing at enigma.com: ", StructuredOutputsParams(regex=r"\w+@\w+\.com")),
        "json": ("Describe a famous car as JSON: ", StructuredOutputsParams(json=CAR)),
        "grammar": ("An SQL query that reads col_1 of table_2: ", StructuredOutputsParams(grammar=SQL)),
    }
    for name, (prompt, constraint) in cases.items():
        params = SamplingParams(temperature=0, max_tokens=64, structured_outputs=constraint)
        text = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].text
        if name == "json":
            json.loads(text)  # it parses
        print(f"{name}: {text!r}")


if __name__ == "__main__":
    main()
