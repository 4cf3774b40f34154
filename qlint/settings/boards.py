"""Common Cortex-M boards and SoCs with the SRAM and flash their vendors document: what `budgets:
{board: NAME}` takes `sram` and `flash` from.

Each row cites the vendor page or datasheet its figures come from. SRAM is all on-chip SRAM the
core can address (a program may get less: a linker script, a stack, other firmware); flash is the
on-chip flash, or the board's external flash where the SoC has none (said in `note`). A team's own
board goes in `.qlint.yaml` under `boards:`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from qlint.settings.sizes import KIB, MIB, show_size


@dataclass(frozen=True)
class Board:
    name: str
    cpu: str
    sram: int     # bytes
    flash: int    # bytes
    source: str   # where the figures come from
    note: str = ""


BOARDS: dict[str, Board] = {b.name: b for b in (
    Board("stm32f746g-disco", "cortex-m7", 320 * KIB, 1 * MIB,
          "https://www.st.com/en/microcontrollers-microprocessors/stm32f746ng.html (STM32F746NG: 1 Mbyte flash, "
          "320 Kbytes RAM)"),
    Board("nucleo-f446re", "cortex-m4", 128 * KIB, 512 * KIB,
          "https://www.st.com/en/microcontrollers-microprocessors/stm32f446re.html (STM32F446RE: 512 Kbytes flash, "
          "128 Kbytes SRAM)"),
    Board("nucleo-h743zi", "cortex-m7", 1 * MIB, 2 * MIB,
          "https://www.st.com/en/microcontrollers-microprocessors/stm32h743zi.html (STM32H743ZI: 2 Mbytes flash, "
          "1 Mbyte RAM)", "the RAM is split over several domains (TCM, AXI, AHB SRAM)"),
    Board("nucleo-l4r5zi", "cortex-m4", 640 * KIB, 2 * MIB,
          "https://www.st.com/en/microcontrollers-microprocessors/stm32l4r5zi.html (STM32L4R5ZI: 2 Mbytes flash, "
          "640 Kbytes SRAM)"),
    Board("nucleo-u575zi-q", "cortex-m33", 786 * KIB, 2 * MIB,
          "https://www.st.com/en/microcontrollers-microprocessors/stm32u575zi.html (STM32U575ZI: 2 Mbytes flash, "
          "786 Kbytes SRAM)"),
    Board("nrf52840-dk", "cortex-m4", 256 * KIB, 1 * MIB,
          "https://www.nordicsemi.com/Products/nRF52840 (nRF52840: 1 MB flash, 256 KB RAM)"),
    Board("arduino-nano-33-ble", "cortex-m4", 256 * KIB, 1 * MIB,
          "https://docs.arduino.cc/hardware/nano-33-ble/ (nRF52840: 1 MB flash, 256 KB SRAM)"),
    Board("nrf5340-dk", "cortex-m33", 512 * KIB, 1 * MIB,
          "https://www.nordicsemi.com/Products/nRF5340 (nRF5340 application core: 1 MB flash, 512 KB RAM)"),
    Board("raspberry-pi-pico", "cortex-m0plus", 264 * KIB, 2 * MIB,
          "https://www.raspberrypi.com/documentation/microcontrollers/pico-series.html (RP2040: 264 kB on-chip "
          "SRAM; Pico: 2 MB QSPI flash)", "flash is the board's external QSPI flash"),
    Board("raspberry-pi-pico-2", "cortex-m33", 520 * KIB, 4 * MIB,
          "https://www.raspberrypi.com/documentation/microcontrollers/pico-series.html (RP2350: 520 KB on-chip "
          "SRAM; Pico 2: 4 MB QSPI flash)", "flash is the board's external QSPI flash"),
    Board("sparkfun-edge", "cortex-m4", 384 * KIB, 1 * MIB,
          "https://ambiq.com/apollo3/ (Apollo3 Blue: 1 MB flash, 384 KB SRAM)"),
    Board("mimxrt1060-evk", "cortex-m7", 1 * MIB, 8 * MIB,
          "https://www.nxp.com/design/design-center/development-boards-and-designs/i-mx-evaluation-and-development-"
          "boards/i-mx-rt1060-evaluation-kit:MIMXRT1060-EVKB (i.MX RT1060: 1 MB on-chip RAM; board: 64 Mbit QSPI "
          "flash)", "flash is the board's external QSPI flash"),
)}


def board_rows(boards: Iterable[Board]) -> list[tuple[str, str, str, str, str]]:
    """Name, CPU, SRAM, flash and source (with its note) of each board: what `qlint boards` prints and
    docs/budgets.md shows."""
    return [(b.name, b.cpu, show_size(b.sram), show_size(b.flash), f"{b.source}; {b.note}" if b.note else b.source)
            for b in boards]
