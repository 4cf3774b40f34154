"""What a program costs on the device it is headed for: estimated cycles per op and core (the
coefficients are data: `settings/cycles.yaml`), the planned memory's live bytes per step, and the
cycles an on-device profile measured, held to the program it was recorded from."""
