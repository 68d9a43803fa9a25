"""Writes the tiny random embedding checkpoints kiln's embedding tests compare against, and
what sentence-transformers makes of them.

    python make_reference.py [NAME...]   # needs torch, transformers>=5, sentence-transformers

Each checkpoint is a Hugging Face folder as sentence-transformers saves it (config.json,
model.safetensors, tokenizer.json, modules.json, 1_Pooling/config.json, 2_Normalize/ when
normalizing) with random weights (seeded) and a byte-level BPE trained on the sentences below.
`expected.json` holds, per checkpoint, the token ids of each input and its embedding (for the
reranker: each pair's ids, token types and transformers' logit). The WordPiece trainer orders
pieces of equal count arbitrarily, so a re-run may renumber the BERT vocabularies: commit
everything it writes together."""

import json
import os
import shutil
import sys

import torch
from sentence_transformers import SentenceTransformer, models
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE, WordPiece
from tokenizers.trainers import BpeTrainer, WordPieceTrainer
from safetensors.torch import save_file
from transformers import (BertConfig, BertForSequenceClassification, BertModel,
                          Gemma3TextConfig, Gemma3TextModel, NomicBertConfig, NomicBertModel,
                          PreTrainedTokenizerFast, Qwen3Config, Qwen3Model, XLMRobertaConfig,
                          XLMRobertaForSequenceClassification)

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors; similar texts land close together.",
    "kiln serves local models over HTTP.",
    "Retrieval finds the passages nearest to a query.",
    "A cat sat on the mat, and the dog did not mind.",
]
INPUTS = [
    "The quick brown fox.",
    "Vectors of similar texts land close together.",
    "kiln",
    "Which passages are nearest to this query about cats and dogs?",
]


def tokenizer(eos):
    tok = Tokenizer(BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=320, special_tokens=[eos],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    eos_id = tok.token_to_id(eos)
    # As Qwen3-Embedding: the end-of-text token closes every input, and its state is pooled.
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, eos_id)])
    return tok, eos_id


def sentence_transformer(out, model, fast, max_len, pooling, normalize):
    """Saves `model` and its tokenizer as sentence-transformers does, with `pooling` and,
    when `normalize`, a Normalize module; returns the loaded SentenceTransformer."""
    raw = os.path.join(out, "_raw")
    model.save_pretrained(raw, safe_serialization=True)
    fast.save_pretrained(raw)
    word = models.Transformer(raw, max_seq_length=max_len)
    pool = models.Pooling(word.get_embedding_dimension(), pooling_mode=pooling)
    modules = [word, pool] + ([models.Normalize()] if normalize else [])
    st = SentenceTransformer(modules=modules, device="cpu")
    st.save(out)
    shutil.rmtree(raw)
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    return st


def bert_tokenizer(tok):
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")


def qwen3_last(out):
    return qwen3(out, "lasttoken", normalize=True)


def qwen3_mean(out):
    return qwen3(out, "mean", normalize=False, seed=1)


def qwen3(out, pooling, normalize, seed=0):
    eos = "<|endoftext|>"
    tok, eos_id = tokenizer(eos)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                      rope_theta=10000.0, tie_word_embeddings=False, eos_token_id=eos_id,
                      bos_token_id=None, pad_token_id=eos_id)
    model = Qwen3Model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.eval()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos)
    fast.padding_side = "left"
    return sentence_transformer(out, model, fast, 256, pooling, normalize), fast


def wordpiece():
    """A lowercasing WordPiece vocabulary trained on the corpus, with BERT's special tokens."""
    from tokenizers import normalizers
    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = WordPieceTrainer(vocab_size=240, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(CORPUS + INPUTS, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok


def bert_config(tok, **extra):
    return BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=128,
                      type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu", **extra)


def randomized(model):
    """Weights far from the initializer's (LayerNorm gains around 1), in eval mode."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.2)
    return model.eval()


def bert(out, pooling, normalize, seed):
    tok = wordpiece()
    torch.manual_seed(seed)
    model = randomized(BertModel(bert_config(tok), add_pooling_layer=False))
    fast = bert_tokenizer(tok)
    return sentence_transformer(out, model, fast, 128, pooling, normalize), fast


def bert_cls(out):
    return bert(out, "cls", normalize=True, seed=2)


def bert_mean(out):
    return bert(out, "mean", normalize=False, seed=3)


def gemma_embed(out):
    """EmbeddingGemma's shape: Gemma 3 text with bidirectional attention (sliding layers see
    `sliding_window / 2` positions each side), mean pooling, then two bias-free Dense layers
    (hidden → 4·hidden → hidden, Identity) and Normalize, as google/embeddinggemma-300m's
    modules.json has them. The window is small so that the inputs run past it; six layers, as
    llama.cpp makes every sixth layer of a gemma-embedding GGUF global whatever the config says."""
    bos, eos = "<bos>", "<eos>"
    tok = Tokenizer(BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=320, special_tokens=["<pad>", eos, bos],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    bos_id, eos_id = tok.token_to_id(bos), tok.token_to_id(eos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, bos_id), (eos, eos_id)])
    torch.manual_seed(7)
    cfg = Gemma3TextConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                           num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
                           head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                           sliding_window=8, sliding_window_pattern=6,
                           query_pre_attn_scalar=16, use_bidirectional_attention=True,
                           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                           bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=0)
    model = Gemma3TextModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.eval()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   pad_token="<pad>")
    raw = os.path.join(out, "_raw")
    model.save_pretrained(raw, safe_serialization=True)
    fast.save_pretrained(raw)
    word = models.Transformer(raw, max_seq_length=256)
    pool = models.Pooling(64, pooling_mode="mean")
    up = models.Dense(64, 256, bias=False, activation_function=torch.nn.Identity())
    down = models.Dense(256, 64, bias=False, activation_function=torch.nn.Identity())
    for d in (up, down):
        with torch.no_grad():
            d.linear.weight.normal_(0.0, 0.2)
    st = SentenceTransformer(modules=[word, pool, up, down, models.Normalize()], device="cpu")
    st.save(out)
    shutil.rmtree(raw)
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    return st, fast


def nomic_mean(out):
    """nomic-embed-text's shape (rotary positions, SwiGLU, no biases, post-norm) with mean
    pooling, written as the Hugging Face hub ships it: nomic's own config keys and tensor names
    (fused `attn.Wqkv`, `mlp.fc11`/`fc12`/`fc2`, `norm1`/`norm2`, `emb_ln`), which
    transformers' NomicBertModel and llama.cpp's converter both read."""
    tok = wordpiece()
    torch.manual_seed(5)
    cfg = NomicBertConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=96, type_vocab_size=2,
                          layer_norm_eps=1e-12, max_position_embeddings=2048,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model = randomized(NomicBertModel(cfg))
    fast = bert_tokenizer(tok)
    st = sentence_transformer(out, model, fast, 2048, "mean", normalize=True)
    nomic_layout(out, model, cfg)
    return st, fast


def nomic_layout(out, model, cfg):
    """Rewrites `out`'s config.json and model.safetensors with nomic's names."""
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    renamed = {
        "embeddings.word_embeddings.weight": sd.pop("embeddings.word_embeddings.weight"),
        "embeddings.token_type_embeddings.weight": sd.pop("embeddings.token_type_embeddings.weight"),
        "emb_ln.weight": sd.pop("embeddings.LayerNorm.weight"),
        "emb_ln.bias": sd.pop("embeddings.LayerNorm.bias"),
    }
    for n in range(cfg.num_hidden_layers):
        src, dst = f"layers.{n}.", f"encoder.layers.{n}."
        qkv = [sd.pop(f"{src}self_attn.{x}_proj.weight") for x in "qkv"]
        renamed[dst + "attn.Wqkv.weight"] = torch.cat(qkv, dim=0)
        for a, b in [("self_attn.o_proj", "attn.out_proj"), ("mlp.up_proj", "mlp.fc11"),
                     ("mlp.gate_proj", "mlp.fc12"), ("mlp.down_proj", "mlp.fc2")]:
            renamed[f"{dst}{b}.weight"] = sd.pop(f"{src}{a}.weight")
        for a, b in [("post_attention_layernorm", "norm1"), ("post_mlp_layernorm", "norm2")]:
            for kind in ["weight", "bias"]:
                renamed[f"{dst}{b}.{kind}"] = sd.pop(f"{src}{a}.{kind}")
    left = [k for k in sd if "position_ids" not in k and "inv_freq" not in k]
    assert not left, left
    save_file(renamed, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert",
        "vocab_size": cfg.vocab_size, "n_embd": cfg.hidden_size, "n_head": cfg.num_attention_heads,
        "n_layer": cfg.num_hidden_layers, "n_inner": cfg.intermediate_size,
        "n_positions": 8192, "max_trained_positions": 2048, "type_vocab_size": 2,
        "layer_norm_epsilon": cfg.layer_norm_eps, "activation_function": "swiglu",
        "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "causal": False,
        "prenorm": False, "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
        "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


QUERY = "Which animal jumps over the dog?"
DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "kiln serves local models over HTTP.",
    "A cat sat on the mat, and the dog did not mind.",
    "Retrieval finds the passages nearest to a query.",
]


def bert_rerank(out):
    """A cross-encoder as sentence-transformers' CrossEncoder saves one: BERT with its pooler
    and a one-label classifier; its scores are the raw logits."""
    tok = wordpiece()
    torch.manual_seed(4)
    model = randomized(BertForSequenceClassification(bert_config(tok, num_labels=1)))
    fast = bert_tokenizer(tok)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    rows = []
    with torch.no_grad():
        for d in DOCUMENTS:
            enc = fast(QUERY, d, return_tensors="pt", return_token_type_ids=True)
            score = model(**enc).logits[0, 0].item()
            rows.append({"query": QUERY, "document": d, "ids": enc["input_ids"][0].tolist(),
                         "type_ids": enc["token_type_ids"][0].tolist(), "score": score})
    return rows


EMBEDDERS = {"qwen3-last": qwen3_last, "qwen3-mean": qwen3_mean, "bert-cls": bert_cls,
             "bert-mean": bert_mean, "nomic-mean": nomic_mean, "gemma-embed": gemma_embed}


def xlmr_tokenizer(out):
    """XLM-RoBERTa's tokenizer as its hub folders ship it: a SentencePiece Unigram model
    (`sentencepiece.bpe.model`, NFKC with its precompiled charsmap) trained here on the texts,
    and transformers' fast conversion of it (fairseq ids: `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>`
    3, then the pieces, then `<mask>`; pairs as `<s> A </s></s> B </s>`)."""
    import sentencepiece as spm
    from transformers.convert_slow_tokenizer import XLMRobertaConverter
    os.makedirs(out, exist_ok=True)
    prefix = os.path.join(out, "sentencepiece.bpe")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS + INPUTS + DOCUMENTS + [QUERY]), model_prefix=prefix,
        model_type="unigram", vocab_size=120, normalization_rule_name="nmt_nfkc",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    os.remove(prefix + ".vocab")

    class Slow:
        """What the converter reads of a slow XLMRobertaTokenizer."""
        vocab_file = prefix + ".model"
        add_prefix_space = True
        legacy = True

        def convert_tokens_to_ids(self, token):
            return {"<s>": 0, "</s>": 2}[token]

    tok = XLMRobertaConverter(Slow()).converted()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   cls_token="<s>", sep_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>")


def xlmr_rerank(out):
    """bge-reranker's shape: XLMRobertaForSequenceClassification (positions counted from the
    padding index + 1, a `classifier.dense` + `classifier.out_proj` head on `<s>`)."""
    fast = xlmr_tokenizer(out)
    torch.manual_seed(6)
    cfg = XLMRobertaConfig(vocab_size=len(fast), hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128,
                           max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5,
                           hidden_act="gelu", num_labels=1)
    model = randomized(XLMRobertaForSequenceClassification(cfg))
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    return score_pairs(model, fast)


def score_pairs(model, fast):
    rows = []
    with torch.no_grad():
        for d in DOCUMENTS:
            enc = fast(QUERY, d, return_tensors="pt", return_token_type_ids=True)
            score = model(**enc).logits[0, 0].item()
            rows.append({"query": QUERY, "document": d, "ids": enc["input_ids"][0].tolist(),
                         "type_ids": enc["token_type_ids"][0].tolist(), "score": score})
    return rows


RERANKERS = {"bert-rerank": bert_rerank, "xlmr-rerank": xlmr_rerank}


def main():
    """Rebuilds the checkpoints named on the command line (all when none), keeping the others'
    entries in expected.json."""
    names = sys.argv[1:] or list(EMBEDDERS) + list(RERANKERS)
    path = os.path.join(HERE, "expected.json")
    expected = {}
    if sys.argv[1:] and os.path.exists(path):
        with open(path) as f:
            expected = json.load(f)
    for name, make in EMBEDDERS.items():
        if name not in names:
            continue
        out = os.path.join(HERE, name)
        shutil.rmtree(out, ignore_errors=True)
        st, fast = make(out)
        emb = st.encode(INPUTS, convert_to_numpy=True, normalize_embeddings=False, batch_size=8)
        expected[name] = [
            {"text": t, "ids": fast(t)["input_ids"], "embedding": [float(x) for x in e]}
            for t, e in zip(INPUTS, emb)
        ]
    for name, make in RERANKERS.items():
        if name in names:
            out = os.path.join(HERE, name)
            shutil.rmtree(out, ignore_errors=True)
            expected[name] = make(out)
    with open(path, "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main()
