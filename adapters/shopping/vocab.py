"""Word pools the catalog generator draws from (no logic here, only data).

Each category lists its brands, model names and product kinds. A kind has a noun, a base price
range in cents, the attributes that appear in the product name (``name_attrs``) and further
attributes shown only in the product's attribute table (``table_attrs``), and feature phrases
used in descriptions (they make multi-word search queries interesting).
"""

from __future__ import annotations

from typing import Any

CategorySpec = dict[str, Any]

CATEGORY_SPECS: list[CategorySpec] = [
    {
        "slug": "laptops", "name": "Laptops", "prefix": "LAP",
        "brands": ["Zenbyte", "Novatek", "Acumen", "Lumora"],
        "models": ["AirBook", "ProBook", "Vector", "Strato", "Nimbus", "Edge"],
        "kinds": [
            {"noun": "Laptop", "price": (49900, 119900)},
            {"noun": "2-in-1 Laptop", "price": (69900, 139900)},
            {"noun": "Gaming Laptop", "price": (99900, 219900)},
        ],
        "name_attrs": {
            "Memory": ["8GB RAM", "16GB RAM", "32GB RAM"],
            "Storage": ["256GB SSD", "512GB SSD", "1TB SSD"],
            "Color": ["Silver", "Space Gray", "Midnight Black", "Arctic Blue"],
        },
        "table_attrs": {
            "Screen Size": ["13.3 inches", "14 inches", "15.6 inches", "16 inches"],
            "Weight": ["2.6 lbs", "3.1 lbs", "3.8 lbs", "4.4 lbs", "5.2 lbs"],
            "Warranty": ["1 year", "2 years", "3 years"],
        },
        "features": ["a backlit keyboard", "all-day battery life", "a fingerprint reader",
                     "Wi-Fi 6E", "a 1080p webcam", "fast charging over USB-C"],
    },
    {
        "slug": "headphones", "name": "Headphones", "prefix": "HPH",
        "brands": ["Sonique", "Auralis", "BassCraft", "Quietone"],
        "models": ["Pulse", "Echo", "Halo", "Drift", "Studio", "Vibe"],
        "kinds": [
            {"noun": "Wireless Over-Ear Headphones", "price": (7900, 34900)},
            {"noun": "Noise Cancelling Headphones", "price": (14900, 39900)},
            {"noun": "Wireless Earbuds", "price": (4900, 24900)},
            {"noun": "Wired Earbuds", "price": (1500, 6900)},
        ],
        "name_attrs": {"Color": ["Black", "White", "Navy", "Rose Gold", "Graphite", "Sage Green"]},
        "table_attrs": {
            "Battery Life": ["8 hours", "12 hours", "20 hours", "30 hours", "40 hours"],
            "Driver Size": ["6 mm", "10 mm", "40 mm", "50 mm"],
            "Warranty": ["1 year", "2 years"],
        },
        "features": ["a built-in microphone", "touch controls", "a carrying case",
                     "sweat resistance", "multipoint pairing", "a deep bass mode"],
    },
    {
        "slug": "cables-adapters", "name": "Cables & Adapters", "prefix": "CBL",
        "brands": ["Linkwell", "Voltix", "Cablox"],
        "models": ["Flex", "Pro", "Max", "Core", "Swift"],
        "kinds": [
            {"noun": "USB-C to USB-C Cable", "price": (799, 2499)},
            {"noun": "USB-C to Lightning Cable", "price": (999, 2999)},
            {"noun": "USB-A to USB-C Cable", "price": (599, 1999)},
            {"noun": "HDMI Cable", "price": (899, 3499)},
            {"noun": "USB-C Hub Adapter", "price": (1999, 7999)},
            {"noun": "Ethernet Cable", "price": (699, 2999)},
        ],
        "name_attrs": {
            "Length": ["3 ft", "6 ft", "10 ft"],
            "Color": ["Black", "White", "Gray", "Red"],
        },
        "table_attrs": {
            "Connector Material": ["Gold-plated", "Nickel-plated", "Aluminum"],
            "Jacket": ["Braided nylon", "PVC", "TPE"],
            "Warranty": ["1 year", "2 years", "Lifetime"],
        },
        "features": ["fast charging", "4K video support", "a braided jacket",
                     "reinforced connectors", "data transfer up to 10 Gbps"],
    },
    {
        "slug": "kitchen", "name": "Kitchen Appliances", "prefix": "KIT",
        "brands": ["Cuisina", "HearthLine", "Kitchara", "Brewmaster"],
        "models": ["Classic", "Select", "Elite", "Compact", "Artisan"],
        "kinds": [
            {"noun": "Stand Mixer", "price": (17900, 49900)},
            {"noun": "Blender", "price": (4900, 19900)},
            {"noun": "Air Fryer", "price": (5900, 21900)},
            {"noun": "Electric Kettle", "price": (2900, 9900)},
            {"noun": "Coffee Maker", "price": (3900, 24900)},
            {"noun": "Toaster", "price": (2500, 11900)},
        ],
        "name_attrs": {"Color": ["Black", "White", "Stainless Steel", "Red", "Cream"]},
        "table_attrs": {
            "Capacity": ["1 quart", "1.7 liters", "4 quarts", "5 quarts", "12 cups"],
            "Power": ["900 watts", "1200 watts", "1500 watts", "1800 watts"],
            "Warranty": ["1 year", "2 years", "5 years"],
        },
        "features": ["dishwasher-safe parts", "an automatic shut-off", "a digital display",
                     "a keep-warm setting", "non-slip feet"],
    },
    {
        "slug": "office-furniture", "name": "Office Furniture", "prefix": "OFF",
        "brands": ["Deskwell", "Oakridge", "Ergonix"],
        "models": ["Summit", "Harbor", "Metro", "Lakeside", "Atlas"],
        "kinds": [
            {"noun": "Ergonomic Office Chair", "price": (12900, 59900)},
            {"noun": "Standing Desk", "price": (24900, 79900)},
            {"noun": "Bookshelf", "price": (6900, 29900)},
            {"noun": "Filing Cabinet", "price": (8900, 25900)},
            {"noun": "Desk Lamp", "price": (2400, 8900)},
        ],
        "name_attrs": {"Color": ["Black", "White", "Walnut", "Gray", "Natural Oak"]},
        "table_attrs": {
            "Material": ["Steel", "Solid wood", "Engineered wood", "Mesh", "Bamboo"],
            "Weight Capacity": ["100 lbs", "220 lbs", "275 lbs", "300 lbs"],
            "Assembly Required": ["Yes", "No"],
        },
        "features": ["adjustable height", "lumbar support", "cable management",
                     "a scratch-resistant finish", "locking casters"],
    },
    {
        "slug": "apparel", "name": "Apparel", "prefix": "APP",
        "brands": ["Northloom", "Urban Thread", "Pinecrest"],
        "models": ["Everyday", "Heritage", "Trail", "Coastal", "Weekend"],
        "kinds": [
            {"noun": "Crew Neck T-Shirt", "price": (1299, 3499)},
            {"noun": "Hooded Sweatshirt", "price": (2999, 6999)},
            {"noun": "Rain Jacket", "price": (5999, 15999)},
            {"noun": "Chino Pants", "price": (3499, 7999)},
            {"noun": "Wool Sweater", "price": (4999, 12999)},
        ],
        "name_attrs": {
            "Size": ["S", "M", "L", "XL"],
            "Color": ["Black", "Navy", "Olive", "Heather Gray", "Burgundy"],
        },
        "table_attrs": {
            "Material": ["100% cotton", "Organic cotton", "Merino wool", "Recycled polyester"],
            "Fit": ["Regular fit", "Slim fit", "Relaxed fit"],
            "Care": ["Machine wash cold", "Hand wash only", "Dry clean only"],
        },
        "features": ["reinforced seams", "a tagless collar", "side pockets",
                     "a water-repellent finish", "a soft brushed lining"],
    },
    {
        "slug": "outdoor", "name": "Outdoor & Camping", "prefix": "OUT",
        "brands": ["Trailhead", "Summitry", "Wildpath"],
        "models": ["Ridge", "Canyon", "Basecamp", "Alpine", "Meadow"],
        "kinds": [
            {"noun": "Camping Tent", "price": (8900, 39900)},
            {"noun": "Sleeping Bag", "price": (4900, 22900)},
            {"noun": "Hiking Backpack", "price": (5900, 24900)},
            {"noun": "Camping Stove", "price": (3900, 14900)},
            {"noun": "Insulated Water Bottle", "price": (1999, 4999)},
        ],
        "name_attrs": {"Color": ["Forest Green", "Orange", "Slate Blue", "Sand", "Charcoal"]},
        "table_attrs": {
            "Capacity": ["2-person", "4-person", "32 oz", "40 liters", "65 liters"],
            "Material": ["Ripstop nylon", "Polyester", "Stainless steel", "Aluminum"],
            "Weight": ["1.2 lbs", "2.5 lbs", "4.8 lbs", "7.5 lbs"],
        },
        "features": ["a waterproof coating", "a compact packed size", "reflective accents",
                     "quick setup", "a lifetime repair program"],
    },
    {
        "slug": "beauty", "name": "Beauty & Personal Care", "prefix": "BTY",
        "brands": ["Lumiere", "Botanica", "PureGlow"],
        "models": ["Daily", "Radiance", "Hydra", "Calm", "Fresh"],
        "kinds": [
            {"noun": "Moisturizing Face Cream", "price": (1499, 5999)},
            {"noun": "Shampoo", "price": (899, 2999)},
            {"noun": "Conditioner", "price": (899, 2999)},
            {"noun": "Mineral Sunscreen SPF 50", "price": (1199, 3499)},
            {"noun": "Body Wash", "price": (699, 1999)},
        ],
        "name_attrs": {
            "Size": ["1.7 fl oz", "8 fl oz", "12 fl oz", "16 fl oz"],
            "Scent": ["Lavender", "Citrus", "Unscented", "Coconut", "Eucalyptus"],
        },
        "table_attrs": {
            "Skin Type": ["All skin types", "Dry skin", "Sensitive skin", "Oily skin"],
            "Key Ingredient": ["Aloe vera", "Shea butter", "Hyaluronic acid", "Vitamin C"],
            "Cruelty Free": ["Yes", "No"],
        },
        "features": ["no parabens", "a recyclable bottle", "a lightweight formula",
                     "dermatologist testing", "vegan ingredients"],
    },
]

REVIEW_AUTHORS: list[str] = [
    "Alice Nguyen", "Brian Carter", "Chloe Martin", "Daniel Kim", "Ella Thompson",
    "Farah Haddad", "George Miller", "Hannah Scott", "Ivan Petrov", "Julia Rossi",
    "Kevin O'Brien", "Laura Chen", "Marcus Reed", "Nina Patel", "Oscar Diaz",
    "Priya Shah", "Quentin Hale", "Rachel Adams", "Samuel Wright", "Tara Brooks",
    "Umar Farouk", "Vanessa Lee", "William Foster", "Xena Morales", "Yusuf Demir",
    "Zoe Bennett", "Aaron Park", "Bella Ortiz", "Carlos Silva", "Diana Hughes",
]

REVIEW_TITLES: dict[int, list[str]] = {
    1: ["Very disappointed", "Broke after a week", "Would not buy again", "Waste of money"],
    2: ["Not great", "Below expectations", "Had some issues", "Just okay at best"],
    3: ["Decent for the price", "It does the job", "Average product", "Mixed feelings"],
    4: ["Really good", "Solid choice", "Happy with it", "Works well"],
    5: ["Absolutely love it", "Excellent quality", "Best purchase this year", "Highly recommend"],
}

REVIEW_TEXTS: dict[int, list[str]] = {
    1: ["It stopped working almost immediately and support was no help.",
        "The quality is far worse than the photos suggest."],
    2: ["It works, but there are several annoyances I did not expect.",
        "Build quality feels cheap and it shows after a few weeks."],
    3: ["Nothing special, but it does what it says.",
        "Good enough for everyday use, though I expected a bit more."],
    4: ["Works well and feels sturdy. Shipping was quick too.",
        "Very good overall with only minor complaints."],
    5: ["Exceeded my expectations in every way. I would buy it again.",
        "Fantastic quality and great value for the money."],
}

ACCOUNTS: list[dict[str, str]] = [
    {"first_name": "Emma", "last_name": "Lopez", "email": "emma.lopez@example.com",
     "password": "Password.123", "street": "101 S San Mateo Dr", "city": "San Mateo",
     "state": "CA", "zip_code": "94010", "phone": "(650) 555-0142"},
    {"first_name": "Noah", "last_name": "Walker", "email": "noah.walker@example.com",
     "password": "Walker.2024", "street": "48 Beacon St", "city": "Boston",
     "state": "MA", "zip_code": "02108", "phone": "(617) 555-0187"},
    {"first_name": "Grace", "last_name": "Okafor", "email": "grace.okafor@example.com",
     "password": "Okafor.789", "street": "2210 Elm Ave", "city": "Austin",
     "state": "TX", "zip_code": "78705", "phone": "(512) 555-0133"},
    {"first_name": "Leo", "last_name": "Fischer", "email": "leo.fischer@example.com",
     "password": "Fischer.456", "street": "77 Pine Ridge Rd", "city": "Denver",
     "state": "CO", "zip_code": "80203", "phone": "(303) 555-0119"},
]
