package geo

import "strings"

// Continent codes as GeoIP databases and Cloudflare's CF-IPContinent header
// write them.
const (
	ContinentAfrica       = "AF"
	ContinentAntarctica   = "AN"
	ContinentAsia         = "AS"
	ContinentEurope       = "EU"
	ContinentNorthAmerica = "NA"
	ContinentOceania      = "OC"
	ContinentSouthAmerica = "SA"
)

// countriesByContinent lists the ISO 3166-1 alpha-2 codes (plus XK, Kosovo,
// which GeoIP databases use) by the continent GeoNames and MaxMind assign
// them; transcontinental countries go where those databases put them (RU
// and CY in Europe, TR and the Caucasus in Asia).
var countriesByContinent = map[string]string{
	ContinentAfrica: "AO BF BI BJ BW CD CF CG CI CM CV DJ DZ EG EH ER ET GA GH GM GN GQ GW KE KM LR LS LY " +
		"MA MG ML MR MU MW MZ NA NE NG RE RW SC SD SH SL SN SO SS ST SZ TD TG TN TZ UG YT ZA ZM ZW",
	ContinentAntarctica: "AQ BV GS HM TF",
	ContinentAsia: "AE AF AM AZ BD BH BN BT CC CN CX GE HK ID IL IN IO IQ IR JO JP KG KH KP KR KW KZ LA LB " +
		"LK MM MN MO MV MY NP OM PH PK PS QA SA SG SY TH TJ TL TM TR TW UZ VN YE",
	ContinentEurope: "AD AL AT AX BA BE BG BY CH CY CZ DE DK EE ES FI FO FR GB GG GI GR HR HU IE IM IS IT JE " +
		"LI LT LU LV MC MD ME MK MT NL NO PL PT RO RS RU SE SI SJ SK SM UA VA XK",
	ContinentNorthAmerica: "AG AI AW BB BL BM BQ BS BZ CA CR CU CW DM DO GD GL GP GT HN HT JM KN KY LC MF MQ " +
		"MS MX NI PA PM PR SV SX TC TT US VC VG VI",
	ContinentOceania:      "AS AU CK FJ FM GU KI MH MP NC NF NR NU NZ PF PG PN PW SB TK TO TV UM VU WF WS",
	ContinentSouthAmerica: "AR BO BR CL CO EC FK GF GY PE PY SR UY VE",
}

// continentOf maps a country code to its continent; built once from
// countriesByContinent.
var continentOf = func() map[string]string {
	m := map[string]string{}
	for cont, list := range countriesByContinent {
		for _, cc := range strings.Fields(list) {
			m[cc] = cont
		}
	}
	return m
}()

// ContinentOf returns the continent code of an ISO 3166-1 alpha-2 country
// code (upper case), or "" for an unknown code.
func ContinentOf(country string) string { return continentOf[country] }

// KnownCountry reports whether country is an ISO 3166-1 alpha-2 code
// (upper case) the continent table knows.
func KnownCountry(country string) bool { return continentOf[country] != "" }

// CountriesOf returns the country codes of a continent, in code order, or
// nil for an unknown continent.
func CountriesOf(continent string) []string {
	list, ok := countriesByContinent[continent]
	if !ok {
		return nil
	}
	return strings.Fields(list)
}
