"""The French -> Japanese pairs the parallel_files tests write as the user's own files (TSV or
{lang} text files, gzipped where named .gz), the data section that reads them, and the pairs a
split gives back."""

import gzip

from jaxformer.data.sources import load_split
from jaxformer.training.experiment import default_config

# French -> Japanese sentences built from parts: every line different, Japanese in its own script.
SUBJECTS = [
    ("le chat", "猫"),
    ("la fille", "女の子"),
    ("mon frère", "私の兄"),
    ("le professeur", "先生"),
    ("une femme", "女性"),
    ("le garçon", "男の子"),
    ("notre voisin", "隣の人"),
    ("la cuisinière", "料理人"),
]
VERBS = [("mange", "を食べる"), ("regarde", "を見る"), ("achète", "を買う"), ("aime", "が好きだ")]
OBJECTS = [
    ("une pomme", "りんご"),
    ("le poisson", "魚"),
    ("un livre", "本"),
    ("la voiture", "車"),
    ("du pain", "パン"),
    ("une fleur", "花"),
]


def sentence_pair(index: int) -> tuple[str, str]:
    """The index-th (French, Japanese) pair; distinct for indices below 2,304."""
    subject = SUBJECTS[index % 8]
    verb = VERBS[index // 8 % 4]
    obj = OBJECTS[index // 32 % 6]
    hour = index // 192 % 12 + 1
    french = f"{subject[0].capitalize()} {verb[0]} {obj[0]} à {hour} heures."
    japanese = f"{subject[1]}は{hour}時に{obj[1]}{verb[1]}。"
    return french, japanese


def pairs(start: int, count: int) -> list[tuple[str, str]]:
    return [sentence_pair(index) for index in range(start, start + count)]


def write_bytes(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def write_text_files(pattern, split_pairs, languages=("fr", "ja")):
    """Line-aligned files, one per language: `pattern` with {lang} filled in."""
    for side, language in enumerate(languages):
        text = "".join(pair[side] + "\n" for pair in split_pairs)
        write_bytes(type(pattern)(str(pattern).replace("{lang}", language)), text.encode())
    return str(pattern)


def write_tsv(path, split_pairs):
    write_bytes(path, "".join(f"{source}\t{target}\n" for source, target in split_pairs).encode())
    return str(path)


def section(tmp_path, name="parallel_files", **values):
    """The data section get_builder reads: fr -> ja, prepared under tmp_path/tfds; `train`,
    `validation`, `test` set data.files, other keywords the data keys."""
    data = default_config().data
    data.name, data.source_language, data.target_language = name, "fr", "ja"
    data.data_dir = str(tmp_path / "tfds")
    for key, value in values.items():
        if key in ("train", "validation", "test"):
            data.files[key] = value
        else:
            data[key] = value
    return data


def read(builder, split):
    source = load_split(builder, split, ("fr", "ja"))
    return [(source[i]["fr"].decode(), source[i]["ja"].decode()) for i in range(len(source))]
