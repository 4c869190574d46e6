"""The line's DefectCode of a NOK by where it failed (config `defect_codes`, lineio/recipes.py): the first
failing region in region order by its name, else that region's verdict's category; read by a PLC through
the real Modbus TCP server (an independent client, npm modbus-serial) and the real OPC UA server (node-opcua:
the DefectCode variable and the ResultReady event). A `defect_codes` naming a region its program does
not have refuses the config in one line naming the recipe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config import load_config
from edge_runtime.config.line_protocols import ModbusConfig
from edge_runtime.core.errors import ConfigError
from edge_runtime.lineio.modbus import ModbusServer
from edge_runtime.lineio.signals import JobRequest
from tests.lineio.test_modbus import plc
from tests.support.line_station import Line

CODES = {"regions": {"screw": 11, "label": 12}, "categories": {"missing": 30, "scratch": 31}}


def region(name: str, nok: bool, category: str = "none") -> dict[str, Any]:
    return {"name": name, "box": [0, 0, 8, 8], "verdict": {"defect": nok, "category": category}, "text": "",
            "outcome": "nok" if nok else "ok", "error": None}


# Part id -> the regions its result carries (in the program's order). The overall verdict is NOK for
# every part id starting with NOK (the Line stand-in's verdict).
PARTS: dict[str, list[dict[str, Any]] | None] = {
    "OK-1": [region("screw", False), region("label", False), region("tile_r1_c1", False)],
    # label fails before the tile: label's own code, though the tile's category has one too
    "NOK-LABEL": [region("screw", False), region("label", True, "torn"), region("tile_r1_c1", True, "missing")],
    # screw and label pass; the tile has no code of its own: its verdict's category's
    "NOK-TILE": [region("screw", False), region("label", False), region("tile_r1_c1", True, "missing")],
    # no regions: the frame's verdict's category (the stand-in's "scratch")
    "NOK-PLAIN": None,
    # a failing region with neither a code nor a mapped category: the default NOK code
    "NOK-DENT": [region("screw", False), region("label", False), region("tile_r1_c1", True, "dent")],
}
EXPECTED = {"OK-1": (1, 0), "NOK-LABEL": (2, 12), "NOK-TILE": (2, 30), "NOK-PLAIN": (2, 31), "NOK-DENT": (2, 1)}


def by_part(job: JobRequest) -> bool:
    return job.part_id.startswith("NOK")


@pytest.fixture
def line(tmp_path: Path) -> Iterator[Line]:
    ln = Line(tmp_path, auto=by_part, regions=lambda job: PARTS[job.part_id], defect_codes=CODES).start()
    yield ln
    ln.stop()


def test_a_plc_reads_the_defect_code_of_the_first_failing_region_over_modbus(line: Line) -> None:
    server = ModbusServer([line.station], ModbusConfig(enabled=True, port=0))
    server.start()
    try:
        assert server.listening.wait(10), server.last_error
        assert server.port is not None
        answers = plc(server.port, *(f"handshake:{part}" for part in PARTS))
        got = {a["part_id"]: (a["result"], a["defect"]) for a in answers}
        assert got == EXPECTED
    finally:
        server.stop()


def test_a_plc_reads_the_defect_code_of_the_first_failing_region_over_opcua(tmp_path: Path) -> None:
    from tests.lineio.test_opcua import Plant
    from tests.support.opcua_peer import NodeClient

    plant = Plant(tmp_path, {"zones": {"auto": by_part, "regions": lambda job: PARTS[job.part_id],
                                       "defect_codes": CODES}})
    try:
        client = plant.connect(NodeClient(tmp_path / "node-plc"), max_retry=1000)
        try:
            assert client.request("subscribe", station="zones", names=["ResultValid"], interval=10, events=True)["ok"]
            for part, (result, code) in EXPECTED.items():
                since = len(client.notes)
                call = client.request("call", station="zones", method="StartSingleJob", args=[part, ""])
                assert call["status"] == "Good", call
                seq = call["out"][0]
                event = client.wait_note(lambda n, s=since: client.notes.index(n) >= s
                                         and n.get("event") == "ResultReady" and n["station"] == "zones", timeout=10)
                assert (event["jobId"], event["result"], event["defectCode"]) == (seq, result, code), part
                values = client.request("read", station="zones", names=["Result", "DefectCode"])
                assert values["ok"] and dict(values["values"]) == {"Result": result, "DefectCode": code}, part
                ack = client.request("call", station="zones", method="ResultAck", args=[seq])
                assert ack["status"] == "Good" and ack["out"] == [True]
        finally:
            client.close()
    finally:
        plant.close()


def test_a_recipes_defect_codes_replace_the_stations(tmp_path: Path) -> None:
    from edge_runtime.core.result import FrameInfo, Result
    from edge_runtime.lineio.recipes import judge
    from edge_runtime.lineio.signals import LineOutcome

    ln = Line(tmp_path, defect_codes=CODES, recipes={"std": {}, "cover": {"defect_codes": {"regions": {"label": 40}}}})
    regions = PARTS["NOK-LABEL"]
    for recipe, code in (("std", 12), ("cover", 40), (None, 12)):
        result = Result(device="d", camera="cam", frame=FrameInfo(1, 8, 8), verdict={"defect": True,
                        "category": "torn"}, text="", model="m", timings_ms={}, prompt="", recipe=recipe,
                        regions=regions)
        assert judge(ln.cfg, result) == (LineOutcome.NOK, code), recipe
    ln.jobs.close()


def config_file(tmp_path: Path, recipe_codes: dict[str, Any], station_codes: dict[str, Any] | None = None) -> Path:
    station = "" if station_codes is None else f"      defect_codes: {station_codes}\n"
    path = tmp_path / "edge.yaml"
    path.write_text(f"""\
programs:
  cover:
    regions:
      - {{name: screw, box: [0, 0, 100, 100]}}
      - {{name: label, box: [100, 0, 100, 100]}}
    tiling: {{rows: 1, cols: 2}}
cameras:
  - {{name: cam1, source: x.png, program: cover, trigger: {{mode: on_demand}}}}
line_io:
  stations:
    - name: weld3
      camera: cam1
      nok_when: [{{field: verdict.defect, equals: true}}]
{station}      recipes:
        std: {{}}
        bolt: {{defect_codes: {recipe_codes}}}
""")
    return path


def test_defect_codes_naming_a_region_the_program_lacks_refuse_the_config_in_one_line(tmp_path: Path) -> None:
    good = load_config(config_file(tmp_path, {"regions": {"screw": 11, "tile_r1_c2": 14}}))
    recipe = good.line_io.stations[0].recipes["bolt"]
    assert recipe.defect_codes is not None and recipe.defect_codes.regions == {"screw": 11, "tile_r1_c2": 14}
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path, {"regions": {"scerw": 11}}))
    message = str(caught.value)
    assert "line_io.stations.weld3.recipes.bolt.defect_codes.regions: no region 'scerw' in program 'cover'" \
        in message and "screw, label, tile_r1_c1, tile_r1_c2" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"line_io\.stations\.weld3\.defect_codes\.regions: no region 'tile_r2_c1'"):
        load_config(config_file(tmp_path, {}, {"regions": {"tile_r2_c1": 3}}))
    with pytest.raises(ConfigError, match="less than or equal to 899"):  # 900 and up are the station's own
        load_config(config_file(tmp_path, {"regions": {"screw": 900}}))
