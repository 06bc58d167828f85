"""The project's own prompt sets for distillation: chat, questions, code, lists, instructions, in
English, Turkish, German, French and Spanish. Written here (no dataset hub is reachable).

Prompts are templates x subjects. The evaluation set uses templates AND subjects that the
training set never contains, so the held-out figure measures the draft on unseen prompts, not on
re-phrasings of its training data.
"""
import json
import random

# (category, template). {s} is a subject.
TRAIN_TEMPLATES = [
    ("question", "What is {s}?"),
    ("question", "Explain {s} in simple terms."),
    ("question", "Why is {s} important?"),
    ("question", "How does {s} work? Give a short answer."),
    ("question", "What are the advantages and disadvantages of {s}?"),
    ("question", "Can you tell me three interesting facts about {s}?"),
    ("question", "What is the history of {s}?"),
    ("list", "List five things everyone should know about {s}."),
    ("list", "Give me a bulleted list of tips related to {s}."),
    ("list", "Name four common misconceptions about {s}."),
    ("list", "Make a numbered list of steps to learn about {s}."),
    ("instruction", "Write a short paragraph about {s}."),
    ("instruction", "Summarize what {s} is in two sentences."),
    ("instruction", "Write a haiku about {s}."),
    ("instruction", "Write a short story for children that involves {s}."),
    ("instruction", "Describe {s} to someone who has never heard of it."),
    ("instruction", "Write a tweet announcing a new book about {s}."),
    ("instruction", "Compare {s} with something similar and explain the difference."),
    ("chat", "Hi! I've been reading about {s} lately. What do you think about it?"),
    ("chat", "My friend says {s} is overrated. Is that true?"),
    ("chat", "I'm giving a talk about {s} tomorrow and I'm nervous. Any advice?"),
    ("chat", "Hello, can you help me understand {s}?"),
    ("code", "Write a Python function related to {s} that takes a list and returns a summary."),
    ("code", "Write a Python class that models {s}."),
    ("code", "Write a short JavaScript snippet that prints a fact about {s}."),
    ("tr", "{s} nedir? Kısaca açıkla."),
    ("tr", "{s} hakkında üç ilginç bilgi ver."),
    ("tr", "{s} konusunda kısa bir paragraf yaz."),
    ("tr", "Merhaba! Bana {s} hakkında bilgi verir misin?"),
    ("de", "Was ist {s}? Erkläre es kurz."),
    ("fr", "Qu'est-ce que {s} ? Explique brièvement."),
    ("es", "¿Qué es {s}? Explícalo brevemente."),
]

# Standalone prompts (no subject): code, arithmetic, rewriting, conversation.
TRAIN_STANDALONE = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that reverses a string.",
    "Write a function in C that returns the length of a string.",
    "Write a SQL query that selects all users older than 30.",
    "Write a bash command that counts the lines in a file.",
    "Write a Python function that computes the factorial of n recursively.",
    "Write a Python script that reads a CSV file and prints the first row.",
    "Write a JavaScript function that sums an array of numbers.",
    "Fix the bug: def add(a, b): return a - b",
    "What is 17 times 23?",
    "If I have 3 apples and buy 5 more, how many apples do I have?",
    "Convert 100 degrees Fahrenheit to Celsius.",
    "Rewrite this sentence to be more formal: gonna grab some food, brb.",
    "Translate to French: Good morning, how are you?",
    "Translate to Turkish: The weather is nice today.",
    "Translate to English: Bugün hava çok güzel.",
    "Tell me a joke.",
    "What should I cook for dinner tonight?",
    "How do I make a cup of tea?",
    "Give me a motivational quote.",
    "What day comes after Wednesday?",
    "Write an email to my boss asking for a day off.",
    "Suggest three names for a pet cat.",
    "What are the primary colors?",
    "Bana bir fıkra anlat.",
    "İstanbul'da gezilecek üç yer öner.",
    "Python'da bir listeyi nasıl sıralarım?",
    "Sabah kahvaltısı için ne önerirsin?",
]

TRAIN_SUBJECTS = [
    "photosynthesis", "the solar system", "machine learning", "the Roman Empire", "coffee",
    "climate change", "the internet", "democracy", "black holes", "the human heart",
    "electric cars", "the French Revolution", "volcanoes", "honey bees", "recycling",
    "the stock market", "meditation", "chess", "the piano", "vaccines", "the ocean",
    "renewable energy", "the moon", "dinosaurs", "bread baking", "the Great Wall of China",
    "gravity", "the immune system", "social media", "football", "rainbows", "cryptography",
    "the printing press", "jazz music", "sleep", "the Amazon rainforest", "rivers",
    "artificial intelligence", "friendship", "tea", "mountains", "the Olympic Games",
    "Mars", "bicycles", "libraries", "earthquakes", "DNA", "Istanbul", "the Ottoman Empire",
    "Turkish coffee", "linked lists", "sorting algorithms", "recursion", "databases",
    "operating systems", "the Python programming language", "time management", "gardening",
    "the water cycle", "airplanes", "penguins", "the Renaissance", "electricity",
]

EVAL_TEMPLATES = [
    ("question", "Could you explain the main idea behind {s}?"),
    ("list", "What are three key facts about {s}? Answer as a list."),
    ("instruction", "Write two sentences that introduce {s} to a student."),
    ("chat", "Hey, quick question: what's the deal with {s}?"),
    ("code", "Write a Python function that returns a dictionary describing {s}."),
    ("tr", "{s} ile ilgili kısa bir açıklama yapar mısın?"),
    ("de", "Erzähl mir etwas über {s}."),
]

EVAL_STANDALONE = [
    "Write a Python function that returns the largest element of a list.",
    "What is 12 plus 45?",
    "Give me a short recipe for pancakes.",
    "Translate to Turkish: I would like a glass of water.",
    "Write a short poem about autumn.",
    "How can I improve my handwriting?",
    "Write a bash loop that prints the numbers 1 to 5.",
    "Yarın için bir yapılacaklar listesi hazırla.",
]

EVAL_SUBJECTS = [
    "glaciers", "the Byzantine Empire", "quantum computers", "octopuses", "origami",
    "the violin", "hash tables", "the Silk Road", "solar panels", "lighthouses",
    "Cappadocia", "binary search",
]


def _expand(templates, subjects, standalone, n, rng):
    combos = [(cat, t.format(s=s)) for cat, t in templates for s in subjects]
    rng.shuffle(combos)
    prompts = [p for _, p in combos[: max(0, n - len(standalone))]] + list(standalone)
    rng.shuffle(prompts)
    return prompts


def build_sets(num_train, num_eval, seed=0):
    """Returns (train, eval) lists of prompt strings; disjoint by construction."""
    rng = random.Random(seed)
    train = _expand(TRAIN_TEMPLATES, TRAIN_SUBJECTS, TRAIN_STANDALONE, num_train, rng)
    evals = _expand(EVAL_TEMPLATES, EVAL_SUBJECTS, EVAL_STANDALONE, num_eval, rng)
    assert not set(train) & set(evals)
    return train[:num_train], evals[:num_eval]


def write_jsonl(path, prompts):
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}, ensure_ascii=False) + "\n")
