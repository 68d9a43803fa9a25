"""Validates deploy/kubernetes/*.yaml against JSON schemas: Kubernetes' standalone-strict
schemas (deployment.json, service.json) and the InferencePool CRD's openAPIV3Schema
(inferencepool.schema.json), all in SCHEMA_DIR. Usage: python3 deploy/check_manifests.py SCHEMA_DIR
(needs pyyaml and jsonschema). CEL rules (x-kubernetes-validations) are not checked."""

import glob
import json
import os
import sys

import jsonschema
import yaml

SCHEMAS = {"Deployment": "deployment.json", "Service": "service.json",
           "InferencePool": "inferencepool.schema.json"}


def main(schema_dir):
    here = os.path.dirname(os.path.abspath(__file__))
    failures = 0
    for path in sorted(glob.glob(os.path.join(here, "kubernetes", "*.yaml"))):
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            kind = doc.get("kind")
            with open(os.path.join(schema_dir, SCHEMAS[kind])) as f:
                schema = json.load(f)
            errors = list(jsonschema.Draft7Validator(schema).iter_errors(doc))
            for e in errors:
                print(f"{os.path.basename(path)} {kind}: {'/'.join(map(str, e.path))}: {e.message}")
            failures += len(errors)
            print(f"{os.path.basename(path)} {kind} {doc['metadata']['name']}: {'ok' if not errors else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
