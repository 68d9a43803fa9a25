"""Converts the tiny BERT checkpoints of this folder to GGUF with llama.cpp's own converter, so
kiln's GGUF BERT path is tested on files as llama.cpp writes them, and adds what transformers
makes of the reranker's GGUF to `expected.json`.

    python make_gguf.py /path/to/llama.cpp [NAME...]   # needs torch and transformers; run after make_reference.py

llama.cpp's converter recognizes a tokenizer by hashing how it splits a test text; these
vocabularies are trained here and unknown to it, so the pre-tokenizer name is forced to
`bert-bge` (what bge-small gets; a WordPiece vocabulary's pre-tokenizer name changes nothing
in llama.cpp), or `gpt-2` for the byte-level BPE of `gemma-embed`. The converter leaves a `BertForSequenceClassification`'s pooler out of the file,
so the reranker's GGUF scores each pair by the classifier on the first token's final state;
`bert-rerank-gguf` holds transformers' scores computed that way.

transformers 5 has a native `NomicBertConfig` that ignores nomic's own config keys (`n_embd`,
`n_layer`, …), and the converter reads configs through AutoConfig first, so it would write
BERT-base's defaults into the header; the shim makes it read nomic's config.json as it is."""

import json
import os
import subprocess
import sys

import torch
from transformers import BertForSequenceClassification, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = """
import runpy, sys
tree = sys.argv.pop(1)
sys.path[:0] = [tree, tree + "/gguf-py"]
import json
from conversion import base
# WordPiece vocabularies as bge-small's; gemma-embed's byte-level BPE splits as GPT-2 does.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: (
    "gpt-2" if self.hparams.get("model_type") == "gemma3_text" else "bert-bge")
raw_json = base.ModelBase.load_hparams
def load_hparams(dir_model, is_mistral_format):
    with open(dir_model / "config.json") as f:
        config = json.load(f)
    return config if config.get("model_type") == "nomic_bert" else raw_json(dir_model, is_mistral_format)
base.ModelBase.load_hparams = staticmethod(load_hparams)
sys.argv[0] = tree + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(tree, name):
    out = os.path.join(HERE, f"{name}.gguf")
    # EmbeddingGemma's Dense modules go into the file only when asked for.
    dense = ["--sentence-transformers-dense-modules"] if name == "gemma-embed" else []
    subprocess.run([sys.executable, "-c", SHIM, tree, os.path.join(HERE, name),
                    "--outtype", "f32", "--outfile", out] + dense, check=True)


def rerank_without_pooler(rows):
    folder = os.path.join(HERE, "bert-rerank")
    model = BertForSequenceClassification.from_pretrained(folder).eval()
    fast = PreTrainedTokenizerFast.from_pretrained(folder)
    out = []
    with torch.no_grad():
        for r in rows:
            enc = fast(r["query"], r["document"], return_tensors="pt",
                       return_token_type_ids=True)
            first = model.bert(**enc).last_hidden_state[:, 0]
            score = model.classifier(first)[0, 0].item()
            out.append({**r, "score": score})
    return out


def main():
    tree, names = sys.argv[1], sys.argv[2:] or ["bert-cls", "bert-mean", "bert-rerank", "nomic-mean",
                                           "gemma-embed", "xlmr-rerank"]
    for name in names:
        convert(tree, name)
    path = os.path.join(HERE, "expected.json")
    with open(path) as f:
        expected = json.load(f)
    expected["bert-rerank-gguf"] = rerank_without_pooler(expected["bert-rerank"])
    with open(path, "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main()
