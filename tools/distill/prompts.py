"""The project's own prompt sets for distillation: chat, questions, code, lists, instructions, in
English, Turkish, German, French and Spanish. Written here (no dataset hub is reachable).

Prompts are templates x subjects. The evaluation set uses templates AND subjects that the
training set never contains, so the held-out figure measures the draft on unseen prompts, not on
re-phrasings of its training data.
"""
import json
import random

from passages import passage_prompts

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

# Added 2026-12-05: the first lists held 64 subjects, so the draft learnt those topics' answers
# (its greedy acceptance was 0.59 on training prompts against 0.43 held out). More subjects and
# phrasings teach it how the target answers, not what it says about a few topics.
MORE_TRAIN_TEMPLATES = [
    ("question", "What do most people get wrong about {s}?"),
    ("question", "How would you describe {s} to a ten-year-old?"),
    ("question", "What is the difference between {s} and its closest alternative?"),
    ("question", "Who first studied {s}, and what did they find?"),
    ("question", "What are the most important parts of {s}?"),
    ("question", "Is {s} good or bad for the environment?"),
    ("question", "What would the world be like without {s}?"),
    ("question", "How has {s} changed over the last hundred years?"),
    ("list", "Give me three pros and three cons of {s}."),
    ("list", "List the main steps involved in {s}."),
    ("list", "What are five questions a beginner might ask about {s}?"),
    ("list", "Write a checklist for someone getting started with {s}."),
    ("instruction", "Write a limerick about {s}."),
    ("instruction", "Explain {s} using an analogy."),
    ("instruction", "Write a short dialogue between a teacher and a student about {s}."),
    ("instruction", "Write a product description for something related to {s}."),
    ("instruction", "Write the opening paragraph of an encyclopedia article on {s}."),
    ("instruction", "Give a one-sentence definition of {s}."),
    ("instruction", "Write a short quiz with three questions about {s}, with answers."),
    ("chat", "I don't really understand {s}. Can you help?"),
    ("chat", "Can you recommend a good way to learn about {s}?"),
    ("chat", "What's your favourite thing about {s}?"),
    ("chat", "My teacher asked us to research {s}. Where should I start?"),
    ("code", "Write a Python function that stores facts about {s} in a list and prints them."),
    ("code", "Write a JSON object that describes {s}."),
    ("code", "Write a C function with a comment explaining {s}."),
    ("tr", "{s} neden önemlidir?"),
    ("tr", "{s} hakkında beş madde yaz."),
    ("tr", "Bir çocuğa {s} nasıl anlatılır?"),
    ("de", "Nenne drei Fakten über {s}."),
    ("fr", "Donne-moi trois informations sur {s}."),
    ("es", "Dame tres datos interesantes sobre {s}."),
    ("it", "Che cos'è {s}? Spiegalo in breve."),
]

MORE_TRAIN_STANDALONE = [
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Write a JavaScript function that checks whether a string is a palindrome.",
    "Write a SQL query that counts the orders per customer.",
    "Write a Python program that prints the Fibonacci numbers below 100.",
    "Write a regular expression that matches an email address.",
    "Write a Go function that adds two integers.",
    "Explain what this code does: for i in range(3): print(i * i)",
    "What is 144 divided by 12?",
    "What is 25 percent of 80?",
    "A train travels 60 km in one hour. How far does it travel in 3 hours?",
    "What is the square root of 81?",
    "Round 3.14159 to two decimal places.",
    "Rewrite this sentence in the passive voice: The cat chased the mouse.",
    "Correct the grammar: she don't like apples.",
    "Summarize in one sentence: The meeting was moved from Monday to Tuesday because the manager was ill.",
    "Translate to German: Where is the train station?",
    "Translate to Spanish: I love reading books.",
    "Translate to English: Je voudrais un café, s'il vous plaît.",
    "Translate to Turkish: See you tomorrow morning.",
    "Write a thank-you note to a friend who helped me move.",
    "Write a short birthday message for my grandmother.",
    "Plan a one-day trip to a city by the sea.",
    "What are some healthy snacks for work?",
    "How do I stay focused while studying?",
    "Give me three ideas for a rainy weekend.",
    "What is the capital of Australia?",
    "How many days are in a leap year?",
    "Which planet is known as the red planet?",
    "Write a riddle and give its answer.",
    "Describe a sunset in three sentences.",
    "Bana kısa bir masal anlat.",
    "Türkçe bir tekerleme yaz.",
    "Ankara hakkında üç bilgi ver.",
    "Bir haftalık spor programı öner.",
    "Erkläre den Unterschied zwischen Wetter und Klima.",
    "Écris un court poème sur la mer.",
    "¿Cómo puedo aprender a cocinar?",
]

MORE_TRAIN_SUBJECTS = [
    # science and nature
    "atoms", "the periodic table", "chemical reactions", "evolution", "cells", "bacteria",
    "viruses", "the brain", "the nervous system", "muscles", "bones", "blood", "the lungs",
    "digestion", "nutrition", "vitamins", "proteins", "the speed of light", "magnetism",
    "sound waves", "friction", "energy", "nuclear power", "wind turbines", "batteries",
    "tides", "hurricanes", "tornadoes", "snow", "clouds", "lightning", "deserts", "forests",
    "coral reefs", "wetlands", "the Arctic", "Antarctica", "the Sahara", "the Himalayas",
    "the Nile", "the Mediterranean Sea", "comets", "asteroids", "the sun", "stars",
    "galaxies", "the Big Bang", "telescopes", "satellites", "space stations", "Jupiter",
    "Saturn's rings", "eclipses", "fossils", "minerals", "soil", "erosion", "photosynthesis in algae",
    "fungi", "trees", "flowers", "seeds", "cacti", "bamboo", "mushrooms",
    # animals
    "elephants", "lions", "wolves", "dolphins", "whales", "sharks", "eagles", "owls",
    "butterflies", "ants", "spiders", "frogs", "snakes", "turtles", "horses", "cats", "dogs",
    "parrots", "bats", "kangaroos", "pandas", "camels", "salmon", "jellyfish", "bees' dances",
    # history and society
    "ancient Egypt", "the pyramids", "ancient Greece", "the Vikings", "the Middle Ages",
    "castles", "knights", "the Industrial Revolution", "the steam engine", "World War I",
    "the Cold War", "the moon landing", "the Aztecs", "the Inca", "Mesopotamia",
    "the invention of writing", "the Age of Exploration",
    "the telephone", "the light bulb", "railways", "money", "banks", "taxes", "elections",
    "human rights", "the United Nations", "the European Union", "trade", "inflation",
    "unemployment", "cities", "villages", "immigration", "languages", "the alphabet",
    "museums", "newspapers", "radio", "television", "cinema", "photography", "fashion",
    "architecture", "bridges", "skyscrapers", "roads", "ports", "Atatürk", "Ephesus",
    "the Bosphorus", "Anatolia", "the Hagia Sophia", "Ankara", "Izmir", "Turkish tea",
    "baklava", "kebab", "the Turkish language",
    # technology and computing
    "computers", "smartphones", "the cloud", "cybersecurity", "passwords", "encryption",
    "programming", "algorithms", "data structures", "arrays", "stacks", "queues", "trees in computer science",
    "graphs", "dynamic programming", "compilers", "interpreters", "version control", "Git",
    "Linux", "the command line", "web browsers", "HTML", "CSS", "JavaScript", "APIs",
    "JSON", "SQL", "spreadsheets", "robots", "drones", "3D printing", "virtual reality",
    "video games", "neural networks", "computer vision", "speech recognition", "open source software",
    "email", "Wi-Fi", "GPS", "microchips", "electric motors",
    # daily life, health, work
    "cooking pasta", "breakfast", "vegetables", "fruit", "chocolate", "cheese", "rice",
    "soup", "spices", "olive oil", "drinking water", "exercise", "running", "swimming",
    "yoga", "walking", "stress", "happiness", "habits", "motivation", "studying", "exams",
    "homework", "reading", "writing essays", "public speaking", "job interviews", "teamwork",
    "leadership", "saving money", "budgeting", "shopping", "cleaning the house", "laundry",
    "moving house", "travel", "packing a suitcase", "camping", "hiking", "cycling to work",
    "first aid", "headaches", "colds", "sleep hygiene", "screen time", "pets", "parenting",
    "birthdays", "weddings", "holidays", "gift giving", "volunteering", "neighbours",
    # arts, sport, culture
    "painting", "drawing", "sculpture", "poetry", "novels", "theatre", "opera", "ballet",
    "the guitar", "drums", "singing", "classical music", "rock music", "hip hop", "folk music",
    "basketball", "tennis", "volleyball", "the World Cup", "marathons", "skiing", "wrestling",
    "board games", "puzzles", "magic tricks", "comics", "animation", "mythology",
    "fairy tales", "Shakespeare", "Mozart", "Leonardo da Vinci", "Marie Curie", "Einstein",
    "Newton", "Darwin", "philosophy", "ethics", "logic", "mathematics", "fractions",
    "prime numbers", "geometry", "triangles", "probability", "statistics", "percentages",
    "algebra", "calculus", "maps", "compasses", "clocks", "calendars", "the weather forecast",
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


def build_sets(num_train, num_eval, seed=0, num_passage=0):
    """Returns (train, eval) lists of prompt strings; disjoint by construction.

    The held-out set is drawn as it was before the MORE_* lists existed, whatever num_train: the
    same random stream, advanced by the first lists' draw of 1,200 training prompts. So with seed 0
    it is `eval_prompts.jsonl`, the set every earlier held-out figure used. The training set is
    drawn from all the lists by a stream of its own; num_passage prompts that quote a passage or a
    program (passages.py, a stream of their own) follow its num_train, so a recipe without them
    draws what it drew before they existed."""
    rng = random.Random(seed)
    _expand(TRAIN_TEMPLATES, TRAIN_SUBJECTS, TRAIN_STANDALONE, 1200, rng)
    evals = _expand(EVAL_TEMPLATES, EVAL_SUBJECTS, EVAL_STANDALONE, num_eval, rng)
    train = _expand(TRAIN_TEMPLATES + MORE_TRAIN_TEMPLATES, TRAIN_SUBJECTS + MORE_TRAIN_SUBJECTS,
                    TRAIN_STANDALONE + MORE_TRAIN_STANDALONE, num_train, random.Random(f"train-{seed}"))
    train = train[:num_train]
    passages = passage_prompts(num_passage, random.Random(f"passage-{seed}"))
    assert not any(s.lower() in p.lower() for p in passages for s in EVAL_SUBJECTS)
    train += passages
    assert not set(train) & set(evals)
    assert not set(TRAIN_SUBJECTS + MORE_TRAIN_SUBJECTS) & set(EVAL_SUBJECTS)
    return train, evals[:num_eval]


def write_jsonl(path, prompts):
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}, ensure_ascii=False) + "\n")
