"""Shop: an online store with a product catalogue, the supervisor's cart, orders, returns and reviews."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from agentloop.apps.base import (
    ApiError,
    AppSpec,
    AppState,
    CallContext,
    boolean,
    integer,
    number,
    page_params,
    paginate,
    string,
)
from agentloop.apps.builtin.apps._iso_time import canonical_time
from agentloop.apps.builtin.people import WorldData, iso

# category -> (brands, [(item, lowest price, highest price)])
CATALOGUE: dict[str, tuple[list[str], list[tuple[str, int, int]]]] = {
    "Electronics": (
        ["Sony", "Anker", "JBL", "Logitech", "Samsung", "Bose", "Belkin", "Ugreen"],
        [
            ("Wireless Earbuds", 29, 199),
            ("Bluetooth Speaker", 25, 180),
            ("Noise-Cancelling Headphones", 79, 349),
            ("USB-C Charger 65W", 19, 59),
            ("Portable Power Bank", 19, 79),
            ("Wireless Mouse", 15, 89),
            ("Mechanical Keyboard", 49, 169),
            ("1080p Webcam", 29, 129),
            ("Smart Watch", 99, 399),
            ("Portable SSD 1TB", 69, 159),
            ("HDMI Cable 2m", 7, 19),
        ],
    ),
    "Home & Kitchen": (
        ["OXO", "Cuisinart", "KitchenAid", "Lodge", "Ninja", "Hamilton Beach", "Zwilling"],
        [
            ("Blender", 39, 199),
            ("Air Fryer", 59, 179),
            ("Chef's Knife 8-inch", 29, 149),
            ("Cast Iron Skillet 12-inch", 24, 69),
            ("Burr Coffee Grinder", 39, 129),
            ("French Press", 19, 49),
            ("Electric Kettle", 25, 89),
            ("Nonstick Frying Pan", 22, 79),
            ("2-Slice Toaster", 25, 99),
            ("Glass Food Storage Set", 19, 59),
            ("Digital Kitchen Scale", 12, 39),
        ],
    ),
    "Sports & Outdoors": (
        ["Nike", "Adidas", "Coleman", "Hydro Flask", "Manduka", "Gaiam", "Osprey", "Bowflex"],
        [
            ("Yoga Mat", 19, 99),
            ("Adjustable Dumbbells", 89, 349),
            ("Insulated Water Bottle 32oz", 19, 49),
            ("2-Person Camping Tent", 69, 249),
            ("Hiking Daypack 24L", 49, 149),
            ("Resistance Bands Set", 12, 39),
            ("Speed Jump Rope", 9, 29),
            ("Foam Roller", 15, 45),
            ("Bike Helmet", 35, 129),
            ("Trail Running Shoes", 79, 169),
        ],
    ),
    "Beauty & Personal Care": (
        ["CeraVe", "Neutrogena", "Philips", "Olaplex", "The Ordinary", "Braun"],
        [
            ("Hydrating Facial Cleanser", 9, 24),
            ("Daily Moisturizer SPF 30", 12, 39),
            ("Electric Toothbrush", 29, 149),
            ("Hair Dryer", 39, 199),
            ("Beard Trimmer", 29, 89),
            ("Vitamin C Serum", 9, 45),
            ("Shampoo 400ml", 8, 30),
            ("Lip Balm 4-Pack", 5, 14),
        ],
    ),
    "Toys & Games": (
        ["LEGO", "Hasbro", "Mattel", "Ravensburger", "Melissa & Doug"],
        [
            ("Classic Building Set", 19, 79),
            ("1000-Piece Jigsaw Puzzle", 14, 29),
            ("Strategy Board Game", 29, 59),
            ("Card Game Party Pack", 9, 24),
            ("Plush Bear", 12, 35),
            ("Wooden Train Set", 29, 89),
        ],
    ),
    "Office Supplies": (
        ["Moleskine", "Pilot", "Post-it", "Staedtler", "Fellowes", "Steelcase"],
        [
            ("Dotted Notebook A5", 9, 29),
            ("Gel Pens 12-Pack", 7, 19),
            ("Sticky Notes 12 Pads", 6, 16),
            ("Desk Organizer", 15, 45),
            ("Monitor Stand", 25, 79),
            ("Ergonomic Office Chair", 149, 599),
            ("Paper Shredder", 39, 129),
            ("Whiteboard 36x24", 29, 79),
        ],
    ),
    "Garden": (
        ["Fiskars", "Gardena", "Miracle-Gro", "Burpee", "Scotts"],
        [
            ("Pruning Shears", 12, 39),
            ("Expandable Garden Hose 50ft", 25, 59),
            ("Potting Mix 16qt", 8, 19),
            ("Herb Seed Kit", 12, 29),
            ("Raised Garden Bed", 59, 189),
            ("Watering Can 2gal", 14, 39),
            ("Garden Kneeler", 19, 49),
        ],
    ),
    "Pet Supplies": (
        ["Kong", "Purina", "PetSafe", "Chuckit!", "Frisco"],
        [
            ("Dog Chew Toy", 7, 19),
            ("Cat Scratching Post", 19, 69),
            ("Automatic Pet Feeder", 49, 129),
            ("Dog Leash 6ft", 9, 29),
            ("Cat Litter 20lb", 12, 29),
            ("Orthopedic Dog Bed", 39, 119),
            ("Ball Launcher", 9, 29),
        ],
    ),
    "Clothing": (
        ["Uniqlo", "Patagonia", "Levi's", "Columbia", "Champion"],
        [
            ("Rain Jacket", 49, 199),
            ("Fleece Pullover", 29, 139),
            ("Slim Fit Jeans", 39, 98),
            ("Cotton T-Shirt 3-Pack", 19, 39),
            ("Wool Socks 4-Pack", 14, 29),
            ("Hoodie", 29, 79),
            ("Baseball Cap", 14, 35),
        ],
    ),
}
BOOKS: list[tuple[str, str]] = [
    ("Project Hail Mary", "Andy Weir"),
    ("Piranesi", "Susanna Clarke"),
    ("Klara and the Sun", "Kazuo Ishiguro"),
    ("The Overstory", "Richard Powers"),
    ("Circe", "Madeline Miller"),
    ("Pachinko", "Min Jin Lee"),
    ("Station Eleven", "Emily St. John Mandel"),
    ("The Midnight Library", "Matt Haig"),
    ("Atomic Habits", "James Clear"),
    ("Educated", "Tara Westover"),
    ("Sapiens", "Yuval Noah Harari"),
    ("The Thursday Murder Club", "Richard Osman"),
    ("Lessons in Chemistry", "Bonnie Garmus"),
]
FEATURES = [
    "Backed by a 2-year warranty.",
    "Customers love its build quality.",
    "Free returns within 30 days.",
    "A best seller in its category.",
    "Compact and easy to store.",
    "Designed for everyday use.",
    "Ships in recyclable packaging.",
]

RETURN_WINDOW_DAYS = 30
FREE_SHIPPING_FROM = 35.0
SHIPPING_FEE = 5.99
ORDER_STATUSES = ["processing", "shipped", "delivered", "cancelled"]


# --- initial state -----------------------------------------------------------------------------


def _price(rng: random.Random, low: int, high: int) -> float:
    return float(rng.randint(low, high)) + rng.choice([0.99, 0.99, 0.49, 0.95, 0.0])


def _products(rng: random.Random) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(name: str, brand: str, category: str, price: float, description: str) -> None:
        in_stock = rng.random() > 0.08
        rows.append(
            {
                "id": len(rows) + 1,
                "name": name,
                "brand": brand,
                "category": category,
                "price": round(price, 2),
                "rating": round(min(5.0, max(2.6, rng.gauss(4.25, 0.4))), 1),
                "review_count": int(rng.lognormvariate(5, 1.3)) + 3,
                "stock": rng.randint(2, 80) if in_stock else 0,
                "description": description,
            }
        )

    for category, (brands, items) in CATALOGUE.items():
        for item, low, high in items:
            makers = rng.sample(brands, 2 if rng.random() < 0.35 else 1)
            for brand in makers:
                add(
                    f"{brand} {item}",
                    brand,
                    category,
                    _price(rng, low, high),
                    f"{item} by {brand}. {rng.choice(FEATURES)}",
                )
    for title, author in BOOKS:
        paperback = _price(rng, 9, 19)
        formats = [("Paperback", paperback)] + ([("Hardcover", paperback + 9)] if rng.random() < 0.4 else [])
        for fmt, price in formats:
            add(f"{title} ({fmt})", author, "Books", price, f"{title} by {author}, {fmt.lower()} edition.")
    return rows


def order_totals(items: list[dict[str, Any]]) -> dict[str, float]:
    """Subtotal, shipping (free from $35) and total of lines with `unit_price` and `quantity`."""
    subtotal = round(sum(i["unit_price"] * i["quantity"] for i in items), 2)
    shipping = 0.0 if subtotal >= FREE_SHIPPING_FROM else SHIPPING_FEE
    return {"subtotal": subtotal, "shipping": shipping, "total": round(subtotal + shipping, 2)}


def make_order(
    products: list[dict[str, Any]],
    quantities: list[int],
    *,
    status: str,
    placed_at: str,
    delivered_at: str | None,
    card_id: int,
    address_id: int,
) -> dict[str, Any]:
    """An order record without its id; prices are the products' current ones."""
    items = [
        {"item_id": n, "product_id": p["id"], "name": p["name"], "unit_price": p["price"], "quantity": q}
        for n, (p, q) in enumerate(zip(products, quantities, strict=True), start=1)
    ]
    return {
        "status": status,
        "placed_at": placed_at,
        "delivered_at": delivered_at,
        "payment_card_id": card_id,
        "address_id": address_id,
        "items": items,
        **order_totals(items),
        "updated_at": delivered_at or placed_at,
    }


def build_state(data: WorldData) -> AppState:
    rng = data.rng("shop")
    products = _products(rng)
    in_stock = [p for p in products if p["stock"] >= 3]
    card_ids = [c["id"] for c in data.cards] or [1]
    address_ids = [a["id"] for a in data.addresses] or [1]

    # (days ago, status): a long delivered history, a couple on their way, one or two just placed
    plan = [(rng.uniform(8, 240), "delivered") for _ in range(rng.randint(15, 22))]
    plan += [(rng.uniform(3, 6.5), "shipped") for _ in range(rng.randint(1, 2))]
    plan += [(rng.uniform(0.3, 2.5), "processing") for _ in range(rng.randint(1, 2))]
    plan.sort(reverse=True)
    orders: dict[str, dict[str, Any]] = {}
    for oid, (days, status) in enumerate(plan, start=1):
        if status == "delivered" and rng.random() < 0.1:
            status = "cancelled"
        picked = rng.sample(in_stock if status in ("processing", "shipped") else products, rng.randint(1, 3))
        quantities = [rng.choice([1, 1, 1, 1, 2, 2, 3]) for _ in picked]
        delivered = data.ago(days=days - rng.uniform(2, 5)) if status == "delivered" else None
        orders[str(oid)] = {
            "id": oid,
            **make_order(
                picked,
                quantities,
                status=status,
                placed_at=data.ago(days=days),
                delivered_at=delivered,
                card_id=rng.choice(card_ids),
                address_id=rng.choice(address_ids),
            ),
        }

    delivered_orders = [o for o in orders.values() if o["status"] == "delivered"]
    old = [o for o in delivered_orders if o["delivered_at"] < data.ago(days=RETURN_WINDOW_DAYS)]
    returns: dict[str, dict[str, Any]] = {}
    for rid, order in enumerate(rng.sample(old, min(2, len(old))), start=1):
        item = rng.choice(order["items"])
        returns[str(rid)] = {
            "id": rid,
            "order_id": order["id"],
            "item_id": item["item_id"],
            "product_id": item["product_id"],
            "quantity": item["quantity"],
            "reason": rng.choice(["Wrong size", "Not as described", "Changed my mind"]),
            "refund_amount": round(item["unit_price"] * item["quantity"], 2),
            "status": "refunded",
            "requested_at": iso(datetime.fromisoformat(order["delivered_at"]) + timedelta(days=rng.randint(1, 10))),
        }

    received = {
        i["product_id"]: (o, i) for o in delivered_orders if o["delivered_at"] < data.ago(days=7) for i in o["items"]
    }
    bought = sorted(received.values(), key=lambda oi: (oi[0]["id"], oi[1]["item_id"]))
    reviews: dict[str, dict[str, Any]] = {}
    for rvid, (order, item) in enumerate(rng.sample(bought, min(3, len(bought))), start=1):
        stars = rng.choice([3, 4, 5, 5])
        reviews[str(rvid)] = {
            "id": rvid,
            "product_id": item["product_id"],
            "rating": stars,
            "text": {3: "It does the job.", 4: "Good value, would buy again.", 5: "Excellent, exactly as described."}[
                stars
            ],
            "created_at": iso(datetime.fromisoformat(order["delivered_at"]) + timedelta(days=rng.randint(1, 6))),
        }

    ordered_now = {i["product_id"] for o in orders.values() if o["status"] == "processing" for i in o["items"]}
    cart_products = rng.sample([p for p in in_stock if p["id"] not in ordered_now], rng.randint(2, 4))
    cart = {
        str(n): {
            "id": n,
            "product_id": p["id"],
            "quantity": rng.choice([1, 1, 2]),
            "added_at": data.ago(days=rng.uniform(0.5, 12)),
        }
        for n, p in enumerate(cart_products, start=1)
    }
    tables: AppState = {
        "products": {str(p["id"]): p for p in products},
        "cart_items": cart,
        "orders": orders,
        "returns": returns,
        "reviews": reviews,
    }
    sequences = {name: {"next": len(rows) + 1} for name, rows in tables.items()}
    return {**tables, "_sequences": sequences, "_sessions": {}}


app = AppSpec(
    name="shop",
    description="An online store: search products, manage your cart, check out, track, cancel and return orders.",
    build_state=build_state,
)


# --- helpers -----------------------------------------------------------------------------------


def _insert(ctx: CallContext, table: str, record: dict[str, Any]) -> dict[str, Any]:
    """Insert with a sequence that never hands out an id again, as a database would after a delete
    (records planted by scenarios move it on too)."""
    rows = ctx.table(table)
    seq = ctx.table("_sequences")[table]
    next_id = max(seq["next"], max((int(k) for k in rows), default=0) + 1)
    seq["next"] = next_id + 1
    record = {"id": next_id, **record}
    rows[str(next_id)] = record
    return record


def _word_in(word: str, text: str) -> bool:
    """A search word matches its singular too ('mats' finds 'Yoga Mat'), as a store's search box would."""
    text = text.casefold()
    return word in text or (len(word) > 3 and word.endswith("s") and word[:-1] in text)


def _product_summary(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "product_id": p["id"],
        "name": p["name"],
        "brand": p["brand"],
        "category": p["category"],
        "price": p["price"],
        "rating": p["rating"],
        "review_count": p["review_count"],
        "in_stock": p["stock"] > 0,
    }


def _categories(ctx: CallContext) -> list[str]:
    return sorted({p["category"] for p in ctx.table("products").values()})


def _cart_lines(ctx: CallContext) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    products = ctx.table("products")
    lines = sorted(ctx.table("cart_items").values(), key=lambda c: c["added_at"])
    return [(line, products[str(line["product_id"])]) for line in lines]


def _check_stock(product: dict[str, Any], quantity: int) -> None:
    if product["stock"] == 0:
        raise ApiError(409, f"{product['name']} (product {product['id']}) is out of stock.")
    if quantity > product["stock"]:
        raise ApiError(
            409,
            f"Only {product['stock']} of {product['name']} (product {product['id']}) left in stock; "
            f"you asked for {quantity}.",
        )


def _return_of(ctx: CallContext, order_id: int, item_id: int) -> dict[str, Any] | None:
    return next(
        (r for r in ctx.table("returns").values() if r["order_id"] == order_id and r["item_id"] == item_id), None
    )


def _return_window_end(order: dict[str, Any]) -> datetime | None:
    if order["status"] != "delivered" or not order["delivered_at"]:
        return None
    return datetime.fromisoformat(order["delivered_at"]) + timedelta(days=RETURN_WINDOW_DAYS)


def _order_summary(o: dict[str, Any]) -> dict[str, Any]:
    return {
        "order_id": o["id"],
        "status": o["status"],
        "placed_at": o["placed_at"],
        "delivered_at": o["delivered_at"],
        "products": [i["name"] for i in o["items"]],
        "item_count": sum(i["quantity"] for i in o["items"]),
        "total": o["total"],
    }


# --- catalogue ---------------------------------------------------------------------------------

PRODUCT_SUMMARY = "[{product_id, name, brand, category, price, rating, review_count, in_stock}]"
SORTS = ["relevance", "price_low_to_high", "price_high_to_low", "rating", "popularity"]


@app.api(
    "List the store's product categories with how many products each has.",
    params=page_params(default_limit=20),
    returns="[{category, product_count}]",
)
def list_categories(ctx: CallContext, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for p in ctx.table("products").values():
        counts[p["category"]] = counts.get(p["category"], 0) + 1
    rows = [{"category": c, "product_count": n} for c, n in sorted(counts.items())]
    return paginate(rows, page_index, page_limit)


@app.api(
    "Search the catalogue. Every word of `query` must appear in the product's name, brand or category. "
    "Combine with filters; `sort_by` orders the results (relevance puts name matches first, then popular ones).",
    params={
        "query": string("Words to look for, e.g. 'yoga mat'."),
        "category": string("Only this category (see list_categories)."),
        "min_price": number("Lowest price in dollars.", minimum=0),
        "max_price": number("Highest price in dollars.", minimum=0),
        "min_rating": number("Only products rated at least this (1 to 5 stars).", minimum=0, maximum=5),
        "in_stock_only": boolean("Only products that can be bought now.", default=False),
        "sort_by": string("Order of the results.", enum=SORTS, default="relevance"),
        **page_params(),
    },
    returns=PRODUCT_SUMMARY,
)
def search_products(
    ctx: CallContext,
    page_index: int,
    page_limit: int,
    sort_by: str,
    in_stock_only: bool,
    query: str | None = None,
    category: str | None = None,
    min_price: float | None = None,
    max_price: float | None = None,
    min_rating: float | None = None,
) -> list[dict[str, Any]]:
    if min_price is not None and max_price is not None and min_price > max_price:
        raise ApiError(422, f"min_price ({min_price}) is higher than max_price ({max_price}).")
    rows = list(ctx.table("products").values())
    if category is not None:
        wanted = category.casefold().strip()
        known = _categories(ctx)
        if wanted not in {c.casefold() for c in known}:
            raise ApiError(404, f"No category named {category!r}. Categories: {', '.join(known)}.")
        rows = [p for p in rows if p["category"].casefold() == wanted]
    words = (query or "").casefold().split()
    if words:
        rows = [p for p in rows if all(_word_in(w, f"{p['name']} {p['brand']} {p['category']}") for w in words)]
    if min_price is not None:
        rows = [p for p in rows if p["price"] >= min_price]
    if max_price is not None:
        rows = [p for p in rows if p["price"] <= max_price]
    if min_rating is not None:
        rows = [p for p in rows if p["rating"] >= min_rating]
    if in_stock_only:
        rows = [p for p in rows if p["stock"] > 0]
    # every ordering ends with the product id, so pages never overlap
    if sort_by == "price_low_to_high":
        rows.sort(key=lambda p: (p["price"], p["id"]))
    elif sort_by == "price_high_to_low":
        rows.sort(key=lambda p: (-p["price"], p["id"]))
    elif sort_by == "rating":
        rows.sort(key=lambda p: (-p["rating"], -p["review_count"], p["id"]))
    else:
        phrase = " ".join(words)
        rows.sort(
            key=lambda p: (
                sort_by == "relevance" and bool(phrase) and phrase not in p["name"].casefold(),
                -p["review_count"],
                p["id"],
            )
        )
    return [_product_summary(p) for p in paginate(rows, page_index, page_limit)]


@app.api(
    "Show one product: price, rating, stock, description and your own review if you wrote one.",
    params={"product_id": integer("Id of the product.")},
    required=["product_id"],
    returns="{product_id, name, brand, category, price, rating, review_count, stock, description, your_review}",
)
def show_product(ctx: CallContext, product_id: int) -> dict[str, Any]:
    p = ctx.get("products", product_id, "product")
    review = next((r for r in ctx.table("reviews").values() if r["product_id"] == product_id), None)
    return {
        **_product_summary(p),
        "stock": p["stock"],
        "description": p["description"],
        "your_review": None if review is None else {"rating": review["rating"], "text": review["text"]},
    }


# --- cart --------------------------------------------------------------------------------------


@app.api(
    "Put a product in your cart. If it is already there, the quantity is added to what the cart holds.",
    params={
        "product_id": integer("Id of the product."),
        "quantity": integer("How many.", minimum=1, maximum=20, default=1),
    },
    required=["product_id"],
    returns="{cart_item_id, product_id, quantity}",
)
def add_to_cart(ctx: CallContext, product_id: int, quantity: int) -> dict[str, Any]:
    product = ctx.get("products", product_id, "product")
    line = next((c for c in ctx.table("cart_items").values() if c["product_id"] == product_id), None)
    total = quantity + (line["quantity"] if line else 0)
    _check_stock(product, total)
    if line is None:
        line = _insert(ctx, "cart_items", {"product_id": product_id, "quantity": quantity, "added_at": iso(ctx.now)})
    else:
        line["quantity"] = total
    return {"cart_item_id": line["id"], "product_id": product_id, "quantity": line["quantity"]}


@app.api(
    "Show your cart with current prices, the shipping fee (free from $35) and the total.",
    returns="{items: [{cart_item_id, product_id, name, unit_price, quantity, subtotal, in_stock}], "
    "subtotal, shipping, total}",
)
def show_cart(ctx: CallContext) -> dict[str, Any]:
    items = [
        {
            "cart_item_id": line["id"],
            "product_id": p["id"],
            "name": p["name"],
            "unit_price": p["price"],
            "quantity": line["quantity"],
            "subtotal": round(p["price"] * line["quantity"], 2),
            "in_stock": p["stock"] >= line["quantity"],
        }
        for line, p in _cart_lines(ctx)
    ]
    if not items:
        return {"items": [], "subtotal": 0.0, "shipping": 0.0, "total": 0.0}
    return {"items": items, **order_totals(items)}


@app.api(
    "Change how many of a product your cart holds.",
    params={
        "cart_item_id": integer("Id of the cart item (from show_cart)."),
        "quantity": integer("The new quantity. To take the product out, use remove_from_cart.", minimum=1, maximum=20),
    },
    required=["cart_item_id", "quantity"],
    returns="{cart_item_id, product_id, quantity}",
)
def update_cart_item(ctx: CallContext, cart_item_id: int, quantity: int) -> dict[str, Any]:
    line = ctx.get("cart_items", cart_item_id, "cart item")
    _check_stock(ctx.get("products", line["product_id"], "product"), quantity)
    line["quantity"] = quantity
    return {"cart_item_id": cart_item_id, "product_id": line["product_id"], "quantity": quantity}


@app.api(
    "Take an item out of your cart.",
    params={"cart_item_id": integer("Id of the cart item (from show_cart).")},
    required=["cart_item_id"],
    returns="A confirmation message.",
)
def remove_from_cart(ctx: CallContext, cart_item_id: int) -> str:
    line = ctx.get("cart_items", cart_item_id, "cart item")
    del ctx.table("cart_items")[str(cart_item_id)]
    return f"Cart item {cart_item_id} (product {line['product_id']}) removed from your cart."


@app.api(
    "Buy everything in your cart. Cards and addresses are the ones supervisor.show_payment_cards and "
    "supervisor.show_addresses list. The cart is emptied and the order starts as 'processing'.",
    params={
        "payment_card_id": integer("Id of the payment card to charge."),
        "address_id": integer("Id of the shipping address."),
    },
    required=["payment_card_id", "address_id"],
    returns="{order_id, status, total}",
)
def checkout(ctx: CallContext, payment_card_id: int, address_id: int) -> dict[str, Any]:
    supervisor = ctx.world.state["supervisor"]
    card = supervisor["payment_cards"].get(str(payment_card_id))
    if card is None:
        raise ApiError(404, f"No payment card with id {payment_card_id}; supervisor.show_payment_cards lists yours.")
    if str(address_id) not in supervisor["addresses"]:
        raise ApiError(404, f"No address with id {address_id}; supervisor.show_addresses lists yours.")
    month, year = (int(part) for part in card["expiry_date"].split("/"))
    if (2000 + year, month) < (ctx.now.year, ctx.now.month):
        raise ApiError(422, f"Card {payment_card_id} ({card['card_name']}) expired in {card['expiry_date']}.")
    lines = _cart_lines(ctx)
    if not lines:
        raise ApiError(409, "Your cart is empty; add products with add_to_cart first.")
    for line, product in lines:
        _check_stock(product, line["quantity"])
    for line, product in lines:
        product["stock"] -= line["quantity"]
        del ctx.table("cart_items")[str(line["id"])]
    now = iso(ctx.now)
    order = make_order(
        [p for _, p in lines],
        [line["quantity"] for line, _ in lines],
        status="processing",
        placed_at=now,
        delivered_at=None,
        card_id=payment_card_id,
        address_id=address_id,
    )
    order = _insert(ctx, "orders", order)
    return {"order_id": order["id"], "status": order["status"], "total": order["total"]}


# --- orders ------------------------------------------------------------------------------------


@app.api(
    "List your orders, newest first, optionally by status or by when they were placed.",
    params={
        "status": string("Only orders with this status.", enum=ORDER_STATUSES),
        "placed_after": string("Only orders placed at or after this date-time (ISO 8601, UTC)."),
        "placed_before": string("Only orders placed before this date-time (ISO 8601, UTC)."),
        **page_params(),
    },
    returns="[{order_id, status, placed_at, delivered_at, products, item_count, total}]",
)
def list_orders(
    ctx: CallContext,
    page_index: int,
    page_limit: int,
    status: str | None = None,
    placed_after: str | None = None,
    placed_before: str | None = None,
) -> list[dict[str, Any]]:
    rows = list(ctx.table("orders").values())
    if status is not None:
        rows = [o for o in rows if o["status"] == status]
    if placed_after is not None:
        after = canonical_time(placed_after, "placed_after")
        rows = [o for o in rows if o["placed_at"] >= after]
    if placed_before is not None:
        before = canonical_time(placed_before, "placed_before")
        rows = [o for o in rows if o["placed_at"] < before]
    rows.sort(key=lambda o: (o["placed_at"], o["id"]), reverse=True)
    return [_order_summary(o) for o in paginate(rows, page_index, page_limit)]


@app.api(
    "Show one order with its items (each with its return status), the card and address used, and the date "
    "until which its items can be returned.",
    params={"order_id": integer("Id of the order.")},
    required=["order_id"],
    returns="{order_id, status, placed_at, delivered_at, return_window_ends, payment_card_id, address_id, "
    "items: [{item_id, product_id, name, unit_price, quantity, return_status}], subtotal, shipping, total}",
)
def show_order(ctx: CallContext, order_id: int) -> dict[str, Any]:
    o = ctx.get("orders", order_id, "order")
    window_end = _return_window_end(o)
    items = []
    for item in o["items"]:
        ret = _return_of(ctx, order_id, item["item_id"])
        items.append({**item, "return_status": None if ret is None else ret["status"]})
    return {
        "order_id": o["id"],
        "status": o["status"],
        "placed_at": o["placed_at"],
        "delivered_at": o["delivered_at"],
        "return_window_ends": None if window_end is None else iso(window_end),
        "payment_card_id": o["payment_card_id"],
        "address_id": o["address_id"],
        "items": items,
        "subtotal": o["subtotal"],
        "shipping": o["shipping"],
        "total": o["total"],
    }


@app.api(
    "Cancel an order that has not shipped yet (status 'processing'). Its products go back in stock and "
    "the card is not charged.",
    params={"order_id": integer("Id of the order.")},
    required=["order_id"],
    returns="{order_id, status}",
)
def cancel_order(ctx: CallContext, order_id: int) -> dict[str, Any]:
    order = ctx.get("orders", order_id, "order")
    if order["status"] == "cancelled":
        raise ApiError(409, f"Order {order_id} is already cancelled.")
    if order["status"] != "processing":
        raise ApiError(
            409,
            f"Order {order_id} is already {order['status']} and can no longer be cancelled; return its items instead.",
        )
    products = ctx.table("products")
    for item in order["items"]:
        product = products.get(str(item["product_id"]))
        if product is not None:
            product["stock"] += item["quantity"]
    order["status"] = "cancelled"
    order["updated_at"] = iso(ctx.now)
    return {"order_id": order_id, "status": "cancelled"}


@app.api(
    f"Return one item of a delivered order, within {RETURN_WINDOW_DAYS} days of delivery. The whole quantity "
    "of that item is returned and refunded to the card once it arrives back.",
    params={
        "order_id": integer("Id of the order."),
        "item_id": integer("Id of the item within the order (from show_order)."),
        "reason": string("Why you return it.", minLength=1),
    },
    required=["order_id", "item_id", "reason"],
    returns="{return_id, refund_amount, status}",
)
def return_item(ctx: CallContext, order_id: int, item_id: int, reason: str) -> dict[str, Any]:
    order = ctx.get("orders", order_id, "order")
    item = next((i for i in order["items"] if i["item_id"] == item_id), None)
    if item is None:
        ids = ", ".join(str(i["item_id"]) for i in order["items"])
        raise ApiError(404, f"Order {order_id} has no item {item_id}; its items are {ids}.")
    window_end = _return_window_end(order)
    if window_end is None:
        raise ApiError(409, f"Order {order_id} is {order['status']}; only delivered orders can be returned.")
    if ctx.now > window_end:
        raise ApiError(409, f"The return window of order {order_id} closed on {iso(window_end)}.")
    if _return_of(ctx, order_id, item_id) is not None:
        raise ApiError(409, f"Item {item_id} of order {order_id} has already been returned.")
    ret = _insert(
        ctx,
        "returns",
        {
            "order_id": order_id,
            "item_id": item_id,
            "product_id": item["product_id"],
            "quantity": item["quantity"],
            "reason": reason,
            "refund_amount": round(item["unit_price"] * item["quantity"], 2),
            "status": "requested",
            "requested_at": iso(ctx.now),
        },
    )
    return {"return_id": ret["id"], "refund_amount": ret["refund_amount"], "status": ret["status"]}


@app.api(
    "Review a product you received in a delivered order. One review per product.",
    params={
        "product_id": integer("Id of the product."),
        "rating": integer("Stars, 1 to 5.", minimum=1, maximum=5),
        "text": string("What you think of it.", minLength=1),
    },
    required=["product_id", "rating", "text"],
    returns="{review_id}",
)
def write_review(ctx: CallContext, product_id: int, rating: int, text: str) -> dict[str, Any]:
    product = ctx.get("products", product_id, "product")
    received = any(
        o["status"] == "delivered" and any(i["product_id"] == product_id for i in o["items"])
        for o in ctx.table("orders").values()
    )
    if not received:
        raise ApiError(403, f"You can only review products you received; no delivered order has {product['name']}.")
    if any(r["product_id"] == product_id for r in ctx.table("reviews").values()):
        raise ApiError(409, f"You already reviewed {product['name']}.")
    review = _insert(
        ctx, "reviews", {"product_id": product_id, "rating": rating, "text": text, "created_at": iso(ctx.now)}
    )
    return {"review_id": review["id"]}
