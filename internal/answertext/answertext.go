// Package answertext writes an answer the way the answerers show it to
// people: the inbox's pages and the Slack answerer's messages.
package answertext

// Line is an answer as one line: an approval's decision with the option
// chosen, if any ("approve (option-b)"); the answer alone when there is no
// decision, and the decision alone when the answer is empty or the same.
func Line(answer, decision string) string {
	switch {
	case decision == "":
		return answer
	case answer == "" || answer == decision:
		return decision
	}
	return decision + " (" + answer + ")"
}
